"""`superinfer simulate`: the Rust scheduler driven by a discrete-event clock
(`superinfer._router.simulate`) on a simulated machine. Module map:
- `profiles`: machines and models — derived from a hardware description (roofline), or
  measured (a Warmup cost model, or a bench run's unloaded latencies);
- `runner`: builds the simulator's JSON config from a workload, runs it, and turns its answer
  into the same `RunResult` a bench produces (labelled "simulated");
- `cli`: the command; `speed`: the 100,000-request speed benchmark.
"""
