#include "distributed/error_file.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "absl/strings/str_cat.h"

namespace ember::distributed {
namespace {

// Precomputed for the signal handler (getenv is not async-signal-safe).
char g_error_file[1024];
struct sigaction g_previous[65];
constexpr int kFatalSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

// Appends `s` JSON-escaped to buf (signal-safe).
size_t AppendEscaped(char* buf, size_t len, size_t cap, const char* s, size_t n) {
  static const char kHex[] = "0123456789abcdef";
  for (size_t i = 0; i < n && len + 6 < cap; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      buf[len++] = '\\';
      buf[len++] = static_cast<char>(c);
    } else if (c == '\n') {
      buf[len++] = '\\';
      buf[len++] = 'n';
    } else if (c < 0x20) {
      memcpy(buf + len, "\\u00", 4);
      len += 4;
      buf[len++] = kHex[c >> 4];
      buf[len++] = kHex[c & 15];
    } else {
      buf[len++] = static_cast<char>(c);
    }
  }
  return len;
}
size_t AppendRaw(char* buf, size_t len, size_t cap, const char* s) {
  const size_t n = strlen(s);
  if (len + n >= cap) return len;
  memcpy(buf + len, s, n);
  return len + n;
}
size_t AppendInt(char* buf, size_t len, size_t cap, uint64_t v, int base) {
  char tmp[24];
  int i = sizeof(tmp);
  do {
    tmp[--i] = "0123456789abcdef"[v % base];
    v /= base;
  } while (v != 0);
  for (; i < static_cast<int>(sizeof(tmp)) && len + 1 < cap; ++i) buf[len++] = tmp[i];
  return len;
}

// Writes the JSON document (signal-safe; the buffer is the caller's).
bool WriteJson(char* buf, size_t cap, const char* message, size_t message_len, const char* stack,
               size_t stack_len) {
  if (g_error_file[0] == '\0') return true;
  size_t len = 0;
  len = AppendRaw(buf, len, cap, "{\"message\": {\"message\": \"");
  len = AppendEscaped(buf, len, cap, message, message_len);
  // Without a stack there is no py_callstack: torchrun's summary then shows
  // the message, where it would show an empty traceback.
  len = AppendRaw(buf, len, cap, "\", \"extraInfo\": {");
  if (stack_len > 0) {
    len = AppendRaw(buf, len, cap, "\"py_callstack\": \"");
    len = AppendEscaped(buf, len, cap, stack, stack_len);
    len = AppendRaw(buf, len, cap, "\", ");
  }
  len = AppendRaw(buf, len, cap, "\"timestamp\": \"");
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  len = AppendInt(buf, len, cap, static_cast<uint64_t>(ts.tv_sec), 10);
  len = AppendRaw(buf, len, cap, "\"}}}\n");
  const int fd = open(g_error_file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  size_t off = 0;
  while (off < len) {
    const ssize_t w = write(fd, buf + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    off += static_cast<size_t>(w);
  }
  close(fd);
  return off == len;
}

const char* FatalName(int sig) {
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
  }
  return "a fatal signal";
}

void OnFatal(int sig, siginfo_t* info, void* context) {
  static char message[256];
  static char stack[8192];
  static char json[16384];
  size_t m = 0;
  m = AppendRaw(message, m, sizeof(message), "the process was killed by signal ");
  m = AppendRaw(message, m, sizeof(message), FatalName(sig));
  m = AppendRaw(message, m, sizeof(message), " (pid ");
  m = AppendInt(message, m, sizeof(message), static_cast<uint64_t>(getpid()), 10);
  m = AppendRaw(message, m, sizeof(message), ")");
  void* frames[64];
  const int n = backtrace(frames, 64);
  size_t s = 0;
  for (int i = 0; i < n; ++i) {
    s = AppendRaw(stack, s, sizeof(stack), "#");
    s = AppendInt(stack, s, sizeof(stack), static_cast<uint64_t>(i), 10);
    s = AppendRaw(stack, s, sizeof(stack), " 0x");
    s = AppendInt(stack, s, sizeof(stack), reinterpret_cast<uintptr_t>(frames[i]), 16);
    Dl_info where;
    if (dladdr(frames[i], &where) != 0) {
      if (where.dli_sname != nullptr) {
        s = AppendRaw(stack, s, sizeof(stack), " ");
        s = AppendRaw(stack, s, sizeof(stack), where.dli_sname);
      }
      if (where.dli_fname != nullptr) {
        s = AppendRaw(stack, s, sizeof(stack), " in ");
        s = AppendRaw(stack, s, sizeof(stack), where.dli_fname);
      }
    }
    s = AppendRaw(stack, s, sizeof(stack), "\n");
  }
  WriteJson(json, sizeof(json), message, m, stack, s);
  // Hand the signal on (the flight recorder's dump, then the default).
  const struct sigaction& prev = g_previous[sig];
  if ((prev.sa_flags & SA_SIGINFO) && prev.sa_sigaction != nullptr) {
    prev.sa_sigaction(sig, info, context);
  } else if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN &&
             prev.sa_handler != nullptr) {
    prev.sa_handler(sig);
  }
  sigaction(sig, &g_previous[sig], nullptr);
  if (g_previous[sig].sa_handler == SIG_IGN) signal(sig, SIG_DFL);
  raise(sig);
}

void Install() {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (path == nullptr || *path == '\0') return;
  snprintf(g_error_file, sizeof(g_error_file), "%s", path);
  void* warm[1];
  backtrace(warm, 1);  // loads libgcc now, not inside the handler
  struct sigaction action {};
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  action.sa_sigaction = &OnFatal;
  for (int sig : kFatalSignals) sigaction(sig, &action, &g_previous[sig]);
}

}  // namespace

absl::Status write_error_file(std::string_view message, std::string_view stack) {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (path == nullptr || *path == '\0') return absl::OkStatus();
  snprintf(g_error_file, sizeof(g_error_file), "%s", path);
  std::string buf(message.size() * 6 + stack.size() * 6 + 256, '\0');
  if (!WriteJson(buf.data(), buf.size(), message.data(), message.size(), stack.data(),
                 stack.size())) {
    return absl::UnavailableError(absl::StrCat("cannot write the error file '", path,
                                               "' (TORCHELASTIC_ERROR_FILE): ", strerror(errno)));
  }
  return absl::OkStatus();
}

int record(const std::function<absl::Status()>& body) {
  Install();
  std::string error;
  try {
    absl::Status status = body();
    if (status.ok()) return 0;
    error = status.ToString();
  } catch (const std::exception& e) {
    error = e.what();
  }
  std::fprintf(stderr, "%s\n", error.c_str());
  absl::Status written = write_error_file(error);
  if (!written.ok()) std::fprintf(stderr, "%s\n", std::string(written.message()).c_str());
  return 1;
}

}  // namespace ember::distributed
