// Denormals on XLA:CPU. The CPU plugin runs compiled code with flush-to-zero and
// denormals-are-zero set (TensorFlow's convention): the closure that runs an executable opens a
// scoped FTZ/DAZ on its thread, and the threads of its intra-op pool are created with it. Eager
// PyTorch keeps denormals (unless torch.set_flush_denormal(True)), so `tensor([1e-40]) > 0` is
// True there and False on XLA:CPU.
//
// Our fix, torch-free and opt-out (TORCH_XLA_DENORMALS=flush): every graph starts with a typed FFI
// custom call (`txla_fp_env`) that clears FTZ/DAZ on the thread running the executable and, the
// first time, on every thread of XLA's intra-op pool (those keep their setting for life). The
// emitter (lowering/stablehlo.cc) routes the module's arguments through an optimization barrier
// together with the call's token, so everything that reads an argument is scheduled after the call
// (XLA:CPU runs an executable's thunks in schedule order, starting on the executing thread).
#pragma once

namespace txla::runtime {

class Client;

const char* FpEnvTarget();  // the custom call's target name

// When a client starts: registers the handler with a CPU plugin (once per plugin library), unless
// TORCH_XLA_DENORMALS=flush, and runs one tiny executable calling it, which clears the intra-op
// pool's threads before any graph runs (and proves that the plugin runs the call). Returns whether
// graphs use it. Any other platform, a plugin without the FFI extension, or a failure: false
// (a failure is reported on stderr; XLA:CPU then flushes denormals, as before).
bool StartFpEnv(Client& client);

// Whether the graph being built now should keep denormals: registered, and the calling thread does
// not flush them itself (torch.set_flush_denormal(True) sets FTZ/DAZ on the thread that calls it;
// then XLA's flushing is what the user asked for). Part of the graph's cache key.
bool KeepDenormals();

// The flag behind KeepDenormals() (tests; the core's Python module exposes it).
void SetFpEnvEnabled(bool on);
bool FpEnvRegistered();

// How many threads of XLA's intra-op pool the handler has cleared so far (tests, diagnostics).
int FpEnvPoolThreadsCleared();

}  // namespace txla::runtime
