#include "tools/shm_manager/server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "multiprocessing/manager_protocol.h"
#include "multiprocessing/unique_fd.h"

namespace ember::shm_manager {
namespace {

using multiprocessing::EncodeFrame;
using multiprocessing::Frame;
using multiprocessing::FrameReader;
using multiprocessing::FrameType;
using multiprocessing::UniqueFd;

struct Client {
  UniqueFd fd;
  int pid = 0;           // from kHello; 0 until then
  bool goodbye = false;  // exited normally
  bool closing = false;  // flush `outbox`, then drop
  FrameReader reader;
  std::string outbox;
  std::set<std::string> regions;
};

class Server {
 public:
  explicit Server(const ServerOptions& options) : options_(options) {}

  absl::Status Listen();
  void Loop();

 private:
  void Accept();
  // Reads what is available; false when the client is gone.
  bool ReadFrom(Client& c);
  void Handle(Client& c, const Frame& f);
  void Reject(Client& c, const std::string& why);
  void Drop(size_t index);
  void UnlinkAll();

  ServerOptions options_;
  UniqueFd listener_;
  std::vector<std::unique_ptr<Client>> clients_;
  std::map<std::string, Client*>
      owner_;  // region -> registering client (null: orphan)
};

absl::Status Server::Listen() {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (options_.socket_path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path '", options_.socket_path, "' is longer than ",
                     sizeof(addr.sun_path) - 1, " bytes"));
  }
  std::strcpy(addr.sun_path, options_.socket_path.c_str());
  listener_.reset(
      ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!listener_.valid())
    return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  if (::bind(listener_.get(), reinterpret_cast<sockaddr*>(&addr),
             sizeof(addr)) != 0 ||
      ::listen(listener_.get(), 128) != 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on '", options_.socket_path, "': ", strerror(errno)));
  }
  return absl::OkStatus();
}

void Server::Accept() {
  while (true) {
    int fd = ::accept4(listener_.get(), nullptr, nullptr,
                       SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    auto c = std::make_unique<Client>();
    c->fd.reset(fd);
    clients_.push_back(std::move(c));
  }
}

void Server::Reject(Client& c, const std::string& why) {
  std::fprintf(stderr, "shm_manager: rejected a client (pid %d): %s\n", c.pid,
               why.c_str());
  c.outbox += EncodeFrame(FrameType::kError,
                          why.substr(0, multiprocessing::kMaxFramePayload));
  c.closing = true;
}

void Server::Handle(Client& c, const Frame& f) {
  if (c.pid == 0 && f.type != FrameType::kHello) {
    return Reject(c, "the first frame must be kHello");
  }
  switch (f.type) {
    case FrameType::kHello: {
      int pid = 0;
      if (c.pid != 0 || !absl::SimpleAtoi(f.payload, &pid) || pid <= 0) {
        return Reject(c, absl::StrCat("bad kHello payload '", f.payload, "'"));
      }
      c.pid = pid;
      c.outbox += EncodeFrame(FrameType::kAck);
      return;
    }
    case FrameType::kRegister:
      if (!multiprocessing::IsValidRegionName(f.payload)) {
        return Reject(c,
                      absl::StrCat("'", f.payload, "' is not a region name"));
      }
      if (auto it = owner_.find(f.payload);
          it != owner_.end() && it->second != nullptr) {
        it->second->regions.erase(f.payload);
      }
      owner_[f.payload] = &c;
      c.regions.insert(f.payload);
      c.outbox += EncodeFrame(FrameType::kAck);
      return;
    case FrameType::kUnregister:
      if (auto it = owner_.find(f.payload); it != owner_.end()) {
        if (it->second != nullptr) it->second->regions.erase(f.payload);
        owner_.erase(it);
      }
      return;
    case FrameType::kGoodbye:
      c.goodbye = true;
      return;
    case FrameType::kAck:
    case FrameType::kError:
      return Reject(c, "clients may not send kAck or kError");
  }
}

bool Server::ReadFrom(Client& c) {
  char buf[4096];
  while (true) {
    ssize_t n = ::recv(c.fd.get(), buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0) return false;
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    c.reader.Append(buf, n);
    while (!c.closing) {
      absl::StatusOr<std::optional<Frame>> f = c.reader.Next();
      if (!f.ok()) {
        Reject(c, std::string(f.status().message()));
        break;
      }
      if (!f->has_value()) break;
      Handle(c, **f);
    }
    if (c.closing) return true;
  }
}

void Server::Drop(size_t index) {
  Client& c = *clients_[index];
  for (const std::string& name : c.regions) {
    if (c.goodbye) {
      owner_[name] = nullptr;  // may still be in use by other processes
    } else {
      ::shm_unlink(name.c_str());  // its creator died: nobody will release it
      owner_.erase(name);
    }
  }
  clients_.erase(clients_.begin() + index);
}

void Server::UnlinkAll() {
  for (const auto& [name, owner] : owner_) ::shm_unlink(name.c_str());
  owner_.clear();
}

void Server::Loop() {
  absl::Time idle_since = absl::Now();
  bool ever_connected = false;
  while (true) {
    std::vector<pollfd> fds;
    fds.push_back({listener_.get(), POLLIN, 0});
    for (const auto& c : clients_) {
      short events = POLLIN;
      if (!c->outbox.empty()) events |= POLLOUT;
      fds.push_back({c->fd.get(), events, 0});
    }
    int timeout_ms = -1;
    if (clients_.empty()) {
      const absl::Duration idle_limit =
          ever_connected
              ? options_.grace
              : std::max(options_.grace, options_.first_client_timeout);
      absl::Duration left = idle_since + idle_limit - absl::Now();
      if (left <= absl::ZeroDuration()) break;
      timeout_ms = static_cast<int>(absl::ToInt64Milliseconds(left)) + 1;
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) break;
    // Clients first (indices match `fds`), newest last; then new connections.
    for (size_t i = clients_.size(); i-- > 0;) {
      Client& c = *clients_[i];
      short revents = fds[i + 1].revents;
      bool alive = true;
      if (revents & (POLLIN | POLLHUP | POLLERR)) alive = ReadFrom(c);
      if (alive && !c.outbox.empty()) {
        ssize_t n = ::send(c.fd.get(), c.outbox.data(), c.outbox.size(),
                           MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) c.outbox.erase(0, n);
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
          alive = false;
      }
      if (!alive || (c.closing && c.outbox.empty())) {
        Drop(i);
        if (clients_.empty()) idle_since = absl::Now();
      }
    }
    if (fds[0].revents & POLLIN) {
      Accept();
      ever_connected |= !clients_.empty();
    }
  }
  // Stop accepting before cleaning up, so a late client starts a new daemon
  // rather than registering with one that is leaving.
  listener_.reset();
  ::unlink(options_.socket_path.c_str());
  UnlinkAll();
}

}  // namespace

absl::Status RunServer(const ServerOptions& options) {
  Server server(options);
  absl::Status listening = server.Listen();
  if (options.ready_fd >= 0) {
    std::string msg =
        listening.ok() ? "ok\n" : std::string(listening.message()) + "\n";
    (void)!::write(options.ready_fd, msg.data(), msg.size());
    ::close(options.ready_fd);
  }
  if (!listening.ok()) return listening;
  server.Loop();
  std::string dir =
      options.socket_path.substr(0, options.socket_path.rfind('/'));
  if (!dir.empty())
    ::rmdir(dir.c_str());  // the private directory, if now empty
  return absl::OkStatus();
}

}  // namespace ember::shm_manager
