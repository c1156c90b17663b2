// Noticing that the client of a non-streaming request went away.
//
// The HTTP library (Debian's cpp-httplib 0.11) gives a handler neither its
// socket nor a way to ask whether the peer is still there; a non-streaming
// handler writes nothing until the answer is complete. The handler runs on
// the thread that owns the connection, so the socket is found by its
// addresses (the kernel's TCP table, /proc/net/tcp and tcp6, gives its
// inode; /proc/self/fd gives the descriptor), and its state is read without
// consuming anything.
#pragma once

#include <string>

namespace dspark::serve {

/// The open socket whose local and peer addresses are the given ones (IPv4
/// or IPv6, numeric as the HTTP library reports them); -1 when none is
/// (or /proc is not mounted: the caller then cannot watch the client).
int find_connection_socket(const std::string& local_addr, int local_port, const std::string& remote_addr,
                           int remote_port);

/// True when the peer of socket `fd` has closed or reset the connection:
/// a non-blocking peek reads end-of-stream or fails with other than
/// EAGAIN/EINTR. Pending request bytes (pipelining) count as open.
bool peer_closed(int fd);

}  // namespace dspark::serve
