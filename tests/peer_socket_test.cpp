// Finding a connection's socket by its addresses, and noticing a peer that
// closed: real loopback connections (IPv4, IPv6, IPv4 on a dual-stack
// listener), with a second connection as a decoy.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "../src/serve/peer_socket.hpp"

namespace dspark::serve {
namespace {

// An open socket, closed on scope exit.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

int port_of(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  return a.ss_family == AF_INET ? ntohs(reinterpret_cast<sockaddr_in&>(a).sin_port)
                                : ntohs(reinterpret_cast<sockaddr_in6&>(a).sin6_port);
}

// A listener on `host` (family `family`, port chosen by the kernel); -1 when
// this machine has no such address (no IPv6 loopback, for instance).
int listen_on(int family, const char* host) {
  const int fd = ::socket(family, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_storage a{};
  socklen_t len = 0;
  if (family == AF_INET) {
    auto& v4 = reinterpret_cast<sockaddr_in&>(a);
    v4.sin_family = AF_INET;
    ::inet_pton(AF_INET, host, &v4.sin_addr);
    len = sizeof v4;
  } else {
    auto& v6 = reinterpret_cast<sockaddr_in6&>(a);
    v6.sin6_family = AF_INET6;
    ::inet_pton(AF_INET6, host, &v6.sin6_addr);
    const int off = 0;
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
    len = sizeof v6;
  }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(fd, 4) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A client connected to `port` on `host`.
int connect_to(int family, const char* host, int port) {
  const int fd = ::socket(family, SOCK_STREAM, 0);
  sockaddr_storage a{};
  socklen_t len = 0;
  if (family == AF_INET) {
    auto& v4 = reinterpret_cast<sockaddr_in&>(a);
    v4.sin_family = AF_INET;
    v4.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, host, &v4.sin_addr);
    len = sizeof v4;
  } else {
    auto& v6 = reinterpret_cast<sockaddr_in6&>(a);
    v6.sin6_family = AF_INET6;
    v6.sin6_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET6, host, &v6.sin6_addr);
    len = sizeof v6;
  }
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), len), 0) << host << " port " << port;
  return fd;
}

// Two connections to one listener: each accepted socket is found by its
// addresses (in every textual form given), the other is not confused with
// it, and closing a client is noticed on its socket only.
void check_pair(int listen_family, const char* listen_host, int client_family, const char* client_host,
                const std::string& server_text, const std::string& client_text) {
  Fd listener(listen_on(listen_family, listen_host));
  if (listener.fd < 0) GTEST_SKIP() << "no " << listen_host << " on this machine";
  const int port = port_of(listener.fd);
  Fd c1(connect_to(client_family, client_host, port));
  Fd a1(::accept(listener.fd, nullptr, nullptr));
  Fd c2(connect_to(client_family, client_host, port));
  Fd a2(::accept(listener.fd, nullptr, nullptr));
  ASSERT_GE(a1.fd, 0);
  ASSERT_GE(a2.fd, 0);
  EXPECT_EQ(find_connection_socket(server_text, port, client_text, port_of(c1.fd)), a1.fd);
  EXPECT_EQ(find_connection_socket(server_text, port, client_text, port_of(c2.fd)), a2.fd);
  // A port no connection has, and the client's side seen from the wrong end.
  EXPECT_EQ(find_connection_socket(server_text, port, client_text, port == 1 ? 2 : 1), -1);
  if (client_text == client_host) {  // the client socket has the client's own family
    EXPECT_EQ(find_connection_socket(client_text, port_of(c1.fd), server_text, port), c1.fd);
  }

  EXPECT_FALSE(peer_closed(a1.fd));
  EXPECT_FALSE(peer_closed(a2.fd));
  ::close(c1.fd);
  c1.fd = -1;
  EXPECT_TRUE(peer_closed(a1.fd));
  EXPECT_FALSE(peer_closed(a2.fd));
}

TEST(PeerSocket, FindsIPv4Connections) { check_pair(AF_INET, "127.0.0.1", AF_INET, "127.0.0.1", "127.0.0.1", "127.0.0.1"); }

TEST(PeerSocket, FindsIPv6Connections) { check_pair(AF_INET6, "::1", AF_INET6, "::1", "::1", "::1"); }

TEST(PeerSocket, FindsIPv4ClientsOfADualStackListenerInEitherForm) {
  check_pair(AF_INET6, "::", AF_INET, "127.0.0.1", "127.0.0.1", "127.0.0.1");
  check_pair(AF_INET6, "::", AF_INET, "127.0.0.1", "::ffff:127.0.0.1", "::ffff:127.0.0.1");
}

TEST(PeerSocket, UnparsableAddressesFindNothing) {
  EXPECT_EQ(find_connection_socket("localhost", 80, "127.0.0.1", 1234), -1);
  EXPECT_EQ(find_connection_socket("", 80, "", 1234), -1);
}

}  // namespace
}  // namespace dspark::serve
