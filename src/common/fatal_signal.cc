#include "common/fatal_signal.h"

#include <execinfo.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstring>
#include <initializer_list>

namespace netreduce {

namespace {

const char* g_program = "netreduce";

void put(const char* s) noexcept {
  size_t n = std::strlen(s);
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}

void put_hex(uintptr_t v) noexcept {
  char buf[2 + 2 * sizeof v + 1];
  char* p = buf + sizeof buf;
  *--p = '\0';
  do {
    *--p = "0123456789abcdef"[v & 0xf];
    v >>= 4;
  } while (v != 0);
  *--p = 'x';
  *--p = '0';
  put(p);
}

void put_dec(unsigned v) noexcept {
  char buf[12];
  char* p = buf + sizeof buf;
  *--p = '\0';
  do {
    *--p = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  put(p);
}

const char* name_of(int sig) noexcept {
  switch (sig) {
    case SIGSEGV:
      return "SIGSEGV";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGILL:
      return "SIGILL";
    case SIGABRT:
      return "SIGABRT";
    default:
      return "signal";
  }
}

void on_fatal(int sig, siginfo_t* info, void*) {
  char thread[17] = {};
  ::prctl(PR_GET_NAME, thread, 0, 0, 0);
  put(g_program);
  put(": fatal ");
  put(name_of(sig));
  put(" (");
  put_dec(static_cast<unsigned>(sig));
  put(") in thread '");
  put(thread);
  put("'");
  if (info && info->si_code <= 0) {  // kill, tgkill, raise, abort: not a fault
    put(", sent by pid ");
    put_dec(static_cast<unsigned>(info->si_pid));
  } else if (info) {
    put(", address ");
    put_hex(reinterpret_cast<uintptr_t>(info->si_addr));
  }
  put("; backtrace:\n");
  void* frames[64];
  const int n = ::backtrace(frames, 64);
  ::backtrace_symbols_fd(frames, n, STDERR_FILENO);
  // SA_RESETHAND restored the default action: die of the same signal.
  ::raise(sig);
}

}  // namespace

void install_fatal_signal_report(const char* program) noexcept {
  g_program = program;
  void* warm[1];
  ::backtrace(warm, 1);
  struct sigaction sa {};
  sa.sa_sigaction = on_fatal;
  sa.sa_flags = SA_SIGINFO | SA_RESETHAND | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) ::sigaction(sig, &sa, nullptr);
}

}  // namespace netreduce
