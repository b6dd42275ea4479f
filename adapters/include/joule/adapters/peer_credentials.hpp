#pragma once
// Who is on the other end of a loopback TCP connection: the uid that owns the client's socket,
// asked of the kernel (NETLINK_SOCK_DIAG, the interface behind `ss -e`). A loopback client is
// a local process, so this identifies the submitter as SO_PEERCRED would on a Unix socket,
// without a second listener.

#include <sys/types.h>

#include <optional>

#include <boost/asio/ip/tcp.hpp>

namespace joule::adapters {

/// The uid of the process that owns the local socket `client` connected to `server` (both
/// ends as this host sees them). Nothing when the client is not on a loopback address, the
/// socket is gone, or the kernel does not answer. One netlink round trip (~10 µs).
std::optional<uid_t> loopback_peer_uid(const boost::asio::ip::tcp::endpoint& server,
                                       const boost::asio::ip::tcp::endpoint& client);

}  // namespace joule::adapters
