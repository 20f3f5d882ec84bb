/* Preloaded into the sessions of sandbox nodes (mlxops/sandbox/nospin.py says why):
 * a send or recv on a non-blocking socket that would block waits for the socket (poll,
 * at most WAIT_MS) before it returns, instead of returning at once to a caller that
 * calls again at once.
 *
 * MLX's ring backend moves data with one thread per socket that loops over its pending
 * sends and recvs on a non-blocking socket without ever waiting (mlx/distributed/ring/
 * ring.cpp, SocketThread::worker): a rank whose peer is late keeps a core busy until the
 * peer's bytes come. On Macs each node spends its own cores on that. Sandbox nodes share
 * the machine's cores, so one node's polling took the CPU its peers needed to catch up.
 *
 * The wait never delays data: poll returns as soon as the socket is ready. A recv that
 * would block does not wait when the thread's previous send moved bytes (that thread has
 * sends to push: waiting for its recv would slow them).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>

#define WAIT_MS 1

static ssize_t (*real_recv)(int, void *, size_t, int);
static ssize_t (*real_send)(int, const void *, size_t, int);
static __thread int sent_last;

static void wait_for(int fd, short events) {
  int saved = errno;
  struct pollfd p = {fd, events, 0};
  poll(&p, 1, WAIT_MS);
  errno = saved;
}

static int would_block(ssize_t r) {
  return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

ssize_t recv(int fd, void *buf, size_t len, int flags) {
  if (!real_recv) real_recv = (ssize_t (*)(int, void *, size_t, int))dlsym(RTLD_NEXT, "recv");
  ssize_t r = real_recv(fd, buf, len, flags);
  if (would_block(r) && !(flags & MSG_DONTWAIT) && !sent_last) wait_for(fd, POLLIN);
  sent_last = 0;
  return r;
}

ssize_t send(int fd, const void *buf, size_t len, int flags) {
  if (!real_send)
    real_send = (ssize_t (*)(int, const void *, size_t, int))dlsym(RTLD_NEXT, "send");
  ssize_t r = real_send(fd, buf, len, flags);
  sent_last = r > 0;
  if (would_block(r) && !(flags & MSG_DONTWAIT)) wait_for(fd, POLLOUT);
  return r;
}
