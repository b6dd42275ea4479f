#include "joule/adapters/peer_credentials.hpp"

#include <arpa/inet.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

namespace joule::adapters {
namespace {

// inet_diag_sockid holds addresses as four big-endian 32-bit words (IPv4 in the first).
void put_address(const boost::asio::ip::address& address, __be32 out[4]) {
  std::memset(out, 0, 4 * sizeof(__be32));
  if (address.is_v4()) {
    const auto bytes = address.to_v4().to_bytes();
    std::memcpy(out, bytes.data(), bytes.size());
  } else {
    const auto bytes = address.to_v6().to_bytes();
    std::memcpy(out, bytes.data(), bytes.size());
  }
}

}  // namespace

std::optional<uid_t> loopback_peer_uid(const boost::asio::ip::tcp::endpoint& server,
                                       const boost::asio::ip::tcp::endpoint& client) {
  if (!client.address().is_loopback()) return std::nullopt;
  const int fd = ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (fd < 0) return std::nullopt;
  timeval limit{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);

  struct {
    nlmsghdr header;
    inet_diag_req_v2 request;
  } message{};
  message.header.nlmsg_len = sizeof message;
  message.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  message.header.nlmsg_flags = NLM_F_REQUEST;  // one socket, looked up by its four-tuple
  message.request.sdiag_family = client.address().is_v4() ? AF_INET : AF_INET6;
  message.request.sdiag_protocol = IPPROTO_TCP;
  message.request.idiag_states = ~0u;
  // The client's socket: its source is the client's end, its destination our end.
  message.request.id.idiag_sport = htons(client.port());
  message.request.id.idiag_dport = htons(server.port());
  put_address(client.address(), message.request.id.idiag_src);
  put_address(server.address(), message.request.id.idiag_dst);
  message.request.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  message.request.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;

  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  std::optional<uid_t> uid;
  if (::sendto(fd, &message, sizeof message, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) ==
      static_cast<ssize_t>(sizeof message)) {
    alignas(nlmsghdr) char buffer[8192];
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n > 0) {
      auto* reply = reinterpret_cast<nlmsghdr*>(buffer);
      for (int length = static_cast<int>(n); NLMSG_OK(reply, length); reply = NLMSG_NEXT(reply, length)) {
        if (reply->nlmsg_type != SOCK_DIAG_BY_FAMILY) break;  // NLMSG_ERROR: no such socket
        const auto* diag = reinterpret_cast<const inet_diag_msg*>(NLMSG_DATA(reply));
        uid = diag->idiag_uid;
        break;
      }
    }
  }
  ::close(fd);
  return uid;
}

}  // namespace joule::adapters
