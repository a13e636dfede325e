/* rsockets edge semantics, run by crates/roce-cli/tests/rdmacm.rs under `rocev2 run` in two namespaces:
 *   rsocket_edge server ADDR PORT   |   rsocket_edge client ADDR PORT
 * Server: rselect on the listening rsocket together with a pipe (the pipe is reported, the rsocket once a
 * client connects), raccept with the peer's address, MSG_PEEK then MSG_WAITALL, rrecvmsg / rreadv over two
 * vectors, a half close by the client (rrecv returns 0 after the data), then a reply and rclose.
 * Client: the option round trips, the refusals (SOCK_DGRAM, riomap, a bad descriptor), a non-blocking rconnect
 * completed through rpoll (POLLOUT, SO_ERROR 0), back to blocking with rfcntl, rsendmsg /
 * rwritev, rshutdown(SHUT_WR), then the reply until the end of the stream with rpoll over the rsocket and a
 * pipe. Breaker findings (each aborted or hung before its fix): rselect with nfds beyond FD_SETSIZE and a larger
 * set, rselect with a negative timeout (EINVAL), rrecv with a length of 2^32 (returns what is there), rreadv over
 * two 1 TiB vectors at the end of the stream (0, no allocation of their total size).
 * Prints "ok" and exits 0 when every check holds; otherwise names the failed check and exits 1. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <rdma/rsocket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <sys/uio.h>
#include <arpa/inet.h>
#include <unistd.h>

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "check failed at line %d: %s (errno %d %s)\n", __LINE__, #c, \
	errno, strerror(errno)); exit(1); } } while (0)

static void fill(char *b, int n, int seed) { for (int i = 0; i < n; i++) b[i] = (char)(i * 7 + seed); }
static int same(const char *b, int n, int seed) { for (int i = 0; i < n; i++) if (b[i] != (char)(i * 7 + seed)) return 0; return 1; }

static int recv_all(int s, char *b, int n)
{
	int got = 0;
	while (got < n) {
		int r = rrecv(s, b + got, n - got, 0);
		if (r <= 0)
			return r;
		got += r;
	}
	return got;
}

static void server(struct sockaddr_in *a)
{
	int l = rsocket(AF_INET, SOCK_STREAM, 0), one = 1, p[2];
	CHECK(l >= 0);
	CHECK(rsetsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0);
	CHECK(rbind(l, (struct sockaddr *) a, sizeof *a) == 0);
	CHECK(rlisten(l, 4) == 0);
	printf("listening\n");
	fflush(stdout);

	/* A readable pipe is reported by rselect beside the (not yet ready) listening rsocket. */
	CHECK(pipe(p) == 0);
	CHECK(write(p[1], "x", 1) == 1);
	fd_set r;
	FD_ZERO(&r);
	FD_SET(l, &r);
	FD_SET(p[0], &r);
	int nfds = (l > p[0] ? l : p[0]) + 1;
	struct timeval tv = { 5, 0 };
	CHECK(rselect(nfds, &r, NULL, NULL, &tv) >= 1 && FD_ISSET(p[0], &r));
	/* A set larger than FD_SETSIZE with nfds 2048, as glibc's select allows. */
	unsigned long wide[2048 / (8 * sizeof(unsigned long))];
	memset(wide, 0, sizeof wide);
	wide[p[0] / (8 * sizeof(unsigned long))] |= 1UL << (p[0] % (8 * sizeof(unsigned long)));
	struct timeval tz = { 0, 0 };
	CHECK(rselect(2048, (fd_set *) wide, NULL, NULL, &tz) == 1);
	struct timeval neg = { -1, 0 };
	CHECK(rselect(nfds, &r, NULL, NULL, &neg) == -1 && errno == EINVAL);
	char x;
	CHECK(read(p[0], &x, 1) == 1);
	/* Now only the listening rsocket: readable once the client connects. */
	FD_ZERO(&r);
	FD_SET(l, &r);
	FD_SET(p[0], &r);
	tv.tv_sec = 60;
	CHECK(rselect(nfds, &r, NULL, NULL, &tv) == 1 && FD_ISSET(l, &r) && !FD_ISSET(p[0], &r));

	struct sockaddr_in peer;
	socklen_t plen = sizeof peer;
	int s = raccept(l, (struct sockaddr *) &peer, &plen);
	CHECK(s >= 0);
	CHECK(plen == sizeof peer && peer.sin_family == AF_INET);
	struct sockaddr_in self;
	socklen_t slen = sizeof self;
	CHECK(rgetsockname(s, (struct sockaddr *) &self, &slen) == 0 && self.sin_addr.s_addr == a->sin_addr.s_addr);

	/* 3000 bytes came as one rsendmsg of two vectors: peek 100, then all with MSG_WAITALL. */
	char b[8192];
	CHECK(rrecv(s, b, 100, MSG_PEEK) == 100 && same(b, 100, 1));
	CHECK(rrecv(s, b, 3000, MSG_WAITALL) == 3000 && same(b, 3000, 1));
	/* 5000 bytes from rwritev, read back with rreadv into two vectors. */
	char v1[1000], v2[4000];
	int got = 0;
	while (got < 5000) {
		struct iovec rest[2];
		int n = 0;
		if (got < 1000)
			rest[n++] = (struct iovec) { v1 + got, 1000 - got };
		rest[n++] = got < 1000 ? (struct iovec) { v2, 4000 } : (struct iovec) { v2 + got - 1000, 5000 - got };
		ssize_t k = rreadv(s, rest, n);
		CHECK(k > 0);
		got += k;
	}
	memcpy(b, v1, 1000);
	memcpy(b + 1000, v2, 4000);
	CHECK(same(b, 5000, 2));
	/* 100 more bytes, read with a length of 2^32 into a 4 GiB mapping (no pages are touched beyond them). */
	size_t huge = (size_t) 1 << 32;
	char *big = mmap(NULL, huge + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	CHECK(big != MAP_FAILED);
	alarm(30);
	int in = 0;
	while (in < 100) {
		ssize_t k = rrecv(s, big + in, huge, 0);
		CHECK(k > 0);
		in += k;
	}
	alarm(0);
	CHECK(in == 100 && same(big, 100, 4));
	munmap(big, huge + 4096);
	/* The client shut its sending side down: the end of the stream after the data. */
	CHECK(rrecv(s, b, sizeof b, 0) == 0);
	/* We may still send. */
	fill(b, 7000, 3);
	int sent = 0;
	while (sent < 7000) {
		int k = rsend(s, b + sent, 7000 - sent, 0);
		CHECK(k > 0);
		sent += k;
	}
	CHECK(rclose(s) == 0);
	CHECK(rclose(l) == 0);
	CHECK(rclose(l) == -1 && errno == EBADF);
}

static void client(struct sockaddr_in *a)
{
	CHECK(rsocket(AF_INET, SOCK_DGRAM, 0) == -1 && errno == ENOTSUP);
	char b[8192];
	CHECK(rsend(12345, b, 1, 0) == -1 && errno == EBADF);
	int s = rsocket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), v = 1, got;
	socklen_t len = sizeof got;
	CHECK(s >= 0);
	CHECK(rsetsockopt(s, IPPROTO_TCP, TCP_NODELAY, &v, sizeof v) == 0);
	CHECK(rgetsockopt(s, IPPROTO_TCP, TCP_NODELAY, &got, &len) == 0 && got == 1);
	CHECK(rsetsockopt(s, SOL_SOCKET, SO_KEEPALIVE, &v, sizeof v) == 0);
	CHECK(rgetsockopt(s, SOL_SOCKET, SO_KEEPALIVE, &got, &len) == 0 && got == 1);
	v = 65536;
	CHECK(rsetsockopt(s, SOL_SOCKET, SO_RCVBUF, &v, sizeof v) == 0);
	CHECK(rgetsockopt(s, SOL_SOCKET, SO_RCVBUF, &got, &len) == 0 && got == 131072);
	CHECK(rsetsockopt(s, SOL_SOCKET, SO_SNDBUF, &v, sizeof v) == 0);
	CHECK(riomap(s, b, sizeof b, PROT_WRITE, 0, -1) == -1 && errno == ENOSYS);
	CHECK(rfcntl(s, F_GETFL) == O_NONBLOCK);

	/* A non-blocking connect is in progress (or, if the REP was that quick, done); POLLOUT when it is done. */
	int r = rconnect(s, (struct sockaddr *) a, sizeof *a);
	CHECK(r == 0 || errno == EINPROGRESS);
	printf("rconnect: %s\n", r == 0 ? "connected" : "in progress");
	struct pollfd cf = { s, POLLOUT, 0 };
	CHECK(rpoll(&cf, 1, 60000) == 1 && cf.revents == POLLOUT);
	len = sizeof got;
	CHECK(rgetsockopt(s, SOL_SOCKET, SO_ERROR, &got, &len) == 0 && got == 0);
	CHECK(rfcntl(s, F_SETFL, 0) == 0 && rfcntl(s, F_GETFL) == 0);
	struct sockaddr_in peer;
	socklen_t plen = sizeof peer;
	CHECK(rgetpeername(s, (struct sockaddr *) &peer, &plen) == 0 && peer.sin_addr.s_addr == a->sin_addr.s_addr
	      && peer.sin_port == a->sin_port);
	len = sizeof got;
	CHECK(rgetsockopt(s, SOL_SOCKET, SO_ERROR, &got, &len) == 0 && got == 0);

	fill(b, 3000, 1);
	struct iovec iov[2] = { { b, 1200 }, { b + 1200, 1800 } };
	struct msghdr m = { .msg_iov = iov, .msg_iovlen = 2 };
	CHECK(rsendmsg(s, &m, 0) == 3000);
	fill(b, 5000, 2);
	struct iovec w[2] = { { b, 2500 }, { b + 2500, 2500 } };
	CHECK(rwritev(s, w, 2) == 5000);
	fill(b, 100, 4);
	CHECK(rsend(s, b, 100, 0) == 100);
	CHECK(rshutdown(s, SHUT_WR) == 0);
	CHECK(rsend(s, b, 1, 0) == -1 && errno == EPIPE);

	/* rpoll over the rsocket and a pipe that stays quiet: only the rsocket becomes readable. */
	int p[2];
	CHECK(pipe(p) == 0);
	struct pollfd f[2] = { { s, POLLIN, 0 }, { p[0], POLLIN, 0 } };
	CHECK(rpoll(f, 2, 60000) >= 1 && (f[0].revents & POLLIN) && f[1].revents == 0);
	CHECK(recv_all(s, b, 7000) == 7000 && same(b, 7000, 3));
	/* The server closed: the end of the stream; also through two 1 TiB vectors (nothing is allocated for them). */
	CHECK(rrecv(s, b, sizeof b, 0) == 0);
	struct iovec hv[2] = { { b, (size_t) 1 << 40 }, { b, (size_t) 1 << 40 } };
	CHECK(rreadv(s, hv, 2) == 0);
	CHECK(rclose(s) == 0);
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: %s server|client ADDR PORT\n", argv[0]);
		return 2;
	}
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[3])) };
	if (inet_pton(AF_INET, argv[2], &a.sin_addr) != 1)
		return 2;
	if (!strcmp(argv[1], "server"))
		server(&a);
	else
		client(&a);
	printf("ok\n");
	return 0;
}
