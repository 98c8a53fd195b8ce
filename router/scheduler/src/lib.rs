//! SuperInfer's scheduling core: the two-tier KV block manager (`kv`) and the scheduling
//! policies (`policy`). Everything here is a pure, synchronous state machine with no I/O and no
//! clock of its own, so the live engine loop and the simulator drive the same code.
