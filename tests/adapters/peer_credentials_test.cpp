#include "joule/adapters/peer_credentials.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

TEST(PeerCredentialsTest, names_the_uid_of_a_loopback_client) {
  asio::io_context io;
  tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  tcp::socket client(io);
  client.connect(acceptor.local_endpoint());
  tcp::socket served = acceptor.accept();
  const auto uid = joule::adapters::loopback_peer_uid(served.local_endpoint(), served.remote_endpoint());
  ASSERT_TRUE(uid);
  EXPECT_EQ(*uid, ::geteuid());
}

TEST(PeerCredentialsTest, names_another_users_socket_as_that_user) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to connect as another uid";
  asio::io_context io;
  tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  const auto port = acceptor.local_endpoint().port();
  const pid_t child = ::fork();
  if (child == 0) {
    // A client that runs as uid 65534 (nobody), holds its connection a moment, and leaves.
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
    asio::io_context own;
    tcp::socket socket(own);
    boost::system::error_code ec;
    socket.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port), ec);
    ::sleep(1);
    ::_exit(ec ? 1 : 0);
  }
  tcp::socket served = acceptor.accept();
  const auto uid = joule::adapters::loopback_peer_uid(served.local_endpoint(), served.remote_endpoint());
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(uid);
  EXPECT_EQ(*uid, 65534u);
}

TEST(PeerCredentialsTest, a_socket_that_is_gone_has_no_owner) {
  const auto uid = joule::adapters::loopback_peer_uid(tcp::endpoint(asio::ip::make_address("127.0.0.1"), 1),
                                                      tcp::endpoint(asio::ip::make_address("127.0.0.1"), 2));
  EXPECT_FALSE(uid);
}

TEST(PeerCredentialsTest, a_remote_client_is_not_looked_up) {
  EXPECT_FALSE(joule::adapters::loopback_peer_uid(tcp::endpoint(asio::ip::make_address("10.0.0.1"), 8571),
                                                  tcp::endpoint(asio::ip::make_address("10.0.0.2"), 40000)));
}

}  // namespace
