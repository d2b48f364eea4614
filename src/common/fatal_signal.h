// Fatal-signal report: on SIGSEGV, SIGBUS, SIGFPE, SIGILL or SIGABRT the
// process writes one block to stderr (which signal, the faulting address,
// the thread's name, a backtrace of the faulting thread) and then dies of
// the same signal with the default action, so its exit status and any core
// dump are what they would have been. A box that crashes must say where.
//
// The handler uses only async-signal-safe calls (write, prctl, raise) and
// glibc's backtrace_symbols_fd, which writes straight to the fd;
// install_fatal_signal_report() calls backtrace once first so that its
// lazy loading of libgcc does not happen inside the handler.
#pragma once

namespace netreduce {

// `program` is the name printed at the start of the report (kept by
// pointer: pass a string literal).
void install_fatal_signal_report(const char* program) noexcept;

}  // namespace netreduce
