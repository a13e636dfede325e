/* rclose of an rsocket while another thread of the process blocks in rrecv on it (a breaker's finding), run by
 * tests/c_edge.rs with rocev2's libraries first on LD_LIBRARY_PATH and the device on ADDR:
 *   rsrace ADDR PORT ROUNDS
 * Each round: a client thread connects and blocks reading; the main thread accepts, a reader thread blocks in
 * rrecv on the accepted socket, and the main thread rcloses that socket 200 ms later. The blocked rrecv must
 * return (0, or -1 with EBADF: a TCP socket closed under a reader also returns) within 10 s, rclose must return,
 * and the client must see the end of the stream. Before the fix this crashed (SIGSEGV: the connection's completion
 * channel freed under the waiting thread) or hung (rclose waited, holding the socket, for the acknowledgement of
 * an event the reader took and could not acknowledge without the socket).
 * Prints "ok" and exits 0 when every check holds; otherwise names the failed check and exits non-zero. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <rdma/rsocket.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHECK(c)                                                                                         \
	do {                                                                                             \
		if (!(c)) {                                                                              \
			fprintf(stderr, "check failed at line %d: %s (errno %d %s)\n", __LINE__, #c, errno, \
				strerror(errno));                                                        \
			exit(1);                                                                         \
		}                                                                                        \
	} while (0)

static struct sockaddr_in addr;
static int acc;
static volatile ssize_t rres = -2;
static volatile int rerr;
static volatile ssize_t cres = -2;

static double now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* Connects, then reads until the end of the stream (the server's rclose). */
static void *client(void *arg)
{
	(void)arg;
	int s = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(s >= 0);
	CHECK(rconnect(s, (struct sockaddr *)&addr, sizeof addr) == 0);
	char buf[8192];
	ssize_t n;
	while ((n = rrecv(s, buf, sizeof buf, 0)) > 0)
		;
	cres = n;
	rclose(s);
	return NULL;
}

/* Blocks in rrecv on the accepted socket (nothing is ever sent to it). */
static void *reader(void *arg)
{
	(void)arg;
	char b[100];
	ssize_t n = rrecv(acc, b, sizeof b, 0);
	rerr = errno;
	rres = n;
	return NULL;
}

static void alarm_h(int s)
{
	(void)s;
	static const char m[] = "TIMEOUT (alarm)\n";
	ssize_t w = write(2, m, sizeof m - 1);
	(void)w;
	_exit(3);
}

int main(int argc, char **argv)
{
	CHECK(argc == 4);
	addr.sin_family = AF_INET;
	CHECK(inet_pton(AF_INET, argv[1], &addr.sin_addr) == 1);
	addr.sin_port = htons(atoi(argv[2]));
	int rounds = atoi(argv[3]);
	signal(SIGALRM, alarm_h);
	alarm(120);
	int lsn = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(lsn >= 0);
	int one = 1;
	rsetsockopt(lsn, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	CHECK(rbind(lsn, (struct sockaddr *)&addr, sizeof addr) == 0);
	CHECK(rlisten(lsn, 8) == 0);
	for (int i = 0; i < rounds; i++) {
		pthread_t c, r;
		cres = -2;
		rres = -2;
		CHECK(pthread_create(&c, NULL, client, NULL) == 0);
		acc = raccept(lsn, NULL, NULL);
		CHECK(acc >= 0);
		CHECK(pthread_create(&r, NULL, reader, NULL) == 0);
		usleep(200000);
		double t0 = now_ms();
		int rc = rclose(acc);
		fprintf(stderr, "round %d: rclose %d in %.0f ms\n", i, rc, now_ms() - t0);
		CHECK(rc == 0);
		for (int k = 0; k < 100 && rres == -2; k++)
			usleep(100000);
		fprintf(stderr, "round %d: rrecv %zd errno %d after %.0f ms\n", i, rres, rerr, now_ms() - t0);
		CHECK(rres != -2); /* still blocked after 10 s */
		CHECK(rres == 0 || (rres == -1 && rerr == EBADF));
		CHECK(pthread_join(r, NULL) == 0);
		CHECK(pthread_join(c, NULL) == 0);
		CHECK(cres == 0);
	}
	CHECK(rclose(lsn) == 0);
	printf("ok\n");
	return 0;
}
