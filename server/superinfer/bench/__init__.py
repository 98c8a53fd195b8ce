"""`superinfer bench`: replays a workload against a running server through its HTTP API and
reports latency, SLO attainment, goodput and throughput. Module map:
- `workload`: request specs (arrival time, prompt, lengths) from `arrivals`, `trace`,
  `sharegpt` and `prompts`;
- `client`: the async streaming client (TGI `/generate_stream` or OpenAI `/v1/completions`);
- `metrics`: per-request outcomes and their summary; `report` and `plots` write them out;
- `runner`: one replay (with the unloaded-latency calibration); `compare`: one server per
  policy, same workload, side by side.
"""
