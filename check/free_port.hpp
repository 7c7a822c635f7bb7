// A loopback TCP port that was free a moment ago (the kernel's choice of an ephemeral one), for the
// tests that start a bootstrap server on it. Another program may take it before the test binds it:
// callers that can tell ("already in use") try another.
#pragma once
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdexcept>

namespace weave::check {

inline int free_port() {
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0) throw std::runtime_error("free_port: no socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  const bool ok = bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  close(s);
  if (!ok) throw std::runtime_error("free_port: no free port");
  return ntohs(a.sin_port);
}

}  // namespace weave::check
