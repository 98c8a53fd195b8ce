// Turns a block-id plan into the fewest memory runs: pairs are sorted by source block and
// neighbours whose source and destination blocks are both consecutive merge into one run.
// Shared by the CPU and CUDA backends; plain C++ so nvcc and the host compiler both take it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace duplexkv {

// One contiguous copy, in bytes relative to the source and destination pool bases.
struct CopyRun {
  int64_t src_offset;
  int64_t dst_offset;
  int64_t bytes;
};

inline void check_ids_in_range(const int64_t* ids, int64_t count, int64_t num_blocks,
                               const char* what) {
  for (int64_t i = 0; i < count; ++i) {
    if (ids[i] < 0 || ids[i] >= num_blocks) {
      throw std::out_of_range(std::string(what) + ": block id " + std::to_string(ids[i]) +
                              " is out of range [0, " + std::to_string(num_blocks) + ")");
    }
  }
}

// src_ids/dst_ids: [count] block ids; both lists are already range-checked and duplicate-free.
inline std::vector<CopyRun> coalesce_runs(const int64_t* src_ids, const int64_t* dst_ids,
                                          int64_t count, int64_t block_bytes) {
  std::vector<int64_t> order(static_cast<size_t>(count));
  std::iota(order.begin(), order.end(), int64_t{0});
  // Plans usually arrive in block order already; skip the sort then.
  const bool sorted = std::is_sorted(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return src_ids[a] < src_ids[b];
  });
  if (!sorted) {
    std::sort(order.begin(), order.end(),
              [&](int64_t a, int64_t b) { return src_ids[a] < src_ids[b]; });
  }
  std::vector<CopyRun> runs;
  int64_t prev_src = -2, prev_dst = -2;
  for (int64_t index : order) {
    const int64_t src = src_ids[index], dst = dst_ids[index];
    if (!runs.empty() && src == prev_src + 1 && dst == prev_dst + 1) {
      runs.back().bytes += block_bytes;
    } else {
      runs.push_back({src * block_bytes, dst * block_bytes, block_bytes});
    }
    prev_src = src;
    prev_dst = dst;
  }
  return runs;
}

// Cuts runs longer than max_bytes so that work spreads evenly over threads or CUDA blocks.
inline std::vector<CopyRun> split_runs(const std::vector<CopyRun>& runs, int64_t max_bytes) {
  std::vector<CopyRun> pieces;
  pieces.reserve(runs.size());
  for (const CopyRun& run : runs) {
    for (int64_t done = 0; done < run.bytes; done += max_bytes) {
      pieces.push_back({run.src_offset + done, run.dst_offset + done,
                        std::min(max_bytes, run.bytes - done)});
    }
  }
  return pieces;
}

}  // namespace duplexkv
