// Finding a connection's socket and noticing a closed peer; see peer_socket.hpp.
#include "peer_socket.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

namespace dspark::serve {

namespace {

// An address as the kernel writes it in /proc/net/tcp and tcp6: each 32-bit
// word of the address as stored (network byte order) printed with %08X on
// this host, then ':' and the port as %04X.
std::string proc_net_address(const unsigned char* addr, std::size_t bytes, int port) {
  std::string out;
  char word[16];
  for (std::size_t i = 0; i < bytes; i += 4) {
    std::uint32_t v = 0;
    std::memcpy(&v, addr + i, 4);
    std::snprintf(word, sizeof word, "%08X", v);
    out += word;
  }
  std::snprintf(word, sizeof word, ":%04X", port);
  return out + word;
}

// The forms (table, text) an endpoint can take: an IPv4 address in
// /proc/net/tcp, or as an IPv4-mapped IPv6 address in /proc/net/tcp6 (a
// dual-stack listener); an IPv6 address in /proc/net/tcp6.
std::vector<std::pair<std::string, std::string>> proc_net_forms(const std::string& host, int port) {
  std::vector<std::pair<std::string, std::string>> forms;
  in_addr v4{};
  in6_addr v6{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    forms.emplace_back("/proc/net/tcp", proc_net_address(reinterpret_cast<const unsigned char*>(&v4), 4, port));
    unsigned char mapped[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    std::memcpy(mapped + 12, &v4, 4);
    forms.emplace_back("/proc/net/tcp6", proc_net_address(mapped, 16, port));
  } else if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    forms.emplace_back("/proc/net/tcp6", proc_net_address(reinterpret_cast<const unsigned char*>(&v6), 16, port));
  }
  return forms;
}

// The socket inode of the connection with these endpoint texts in `table`;
// 0 when there is none (TIME_WAIT entries have inode 0 and never match).
unsigned long connection_inode(const std::string& table, const std::string& local, const std::string& remote) {
  std::ifstream f(table);
  std::string line;
  std::getline(f, line);  // column names
  while (std::getline(f, line)) {
    // sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...
    std::istringstream in(line);
    std::string sl, loc, rem, st, queues, timer, retr, uid, timeout;
    unsigned long inode = 0;
    if (!(in >> sl >> loc >> rem >> st >> queues >> timer >> retr >> uid >> timeout >> inode)) continue;
    if (inode != 0 && loc == local && rem == remote) return inode;
  }
  return 0;
}

// The descriptor of this process whose /proc/self/fd link names socket
// `inode`; -1 when none does.
int descriptor_of_socket(unsigned long inode) {
  const std::string want = "socket:[" + std::to_string(inode) + "]";
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    std::error_code link_ec;
    if (std::filesystem::read_symlink(entry.path(), link_ec).string() != want) continue;
    char* end = nullptr;
    const std::string name = entry.path().filename().string();
    const long fd = std::strtol(name.c_str(), &end, 10);
    if (end != name.c_str() && *end == '\0') return static_cast<int>(fd);
  }
  return -1;
}

}  // namespace

int find_connection_socket(const std::string& local_addr, int local_port, const std::string& remote_addr,
                           int remote_port) {
  // The connection's socket inode comes from the kernel's TCP table and the
  // descriptor from /proc/self/fd's links: no system call touches another
  // connection's descriptor, which another thread may be closing.
  for (const auto& [table, local] : proc_net_forms(local_addr, local_port))
    for (const auto& [remote_table, remote] : proc_net_forms(remote_addr, remote_port))
      if (table == remote_table)
        if (const unsigned long inode = connection_inode(table, local, remote); inode != 0)
          return descriptor_of_socket(inode);
  return -1;
}

bool peer_closed(int fd) {
  char byte = 0;
  const ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return false;
  if (n == 0) return true;
  return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

}  // namespace dspark::serve
