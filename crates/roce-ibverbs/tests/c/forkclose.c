/* A forked child that closes the device it inherited leaves the parent's device alone (breaker finding: the child's
 * ibv_close_device removed the parent's stats endpoint socket, so the parent vanished from `rocev2 stat`, and
 * printed a panic joining a thread it does not have). Run by tests/c_api.rs with ROCEV2_RUN_DIR set to an empty
 * directory: after the child has closed and exited, the parent's endpoint socket (`<pid>.*.sock`) is still there
 * and the child printed nothing; and the child's ibv_dealloc_pd / ibv_close_device return even when the runtime's
 * thread held a lock at the fork (1,000 children; a stuck one is ended by its alarm and counted). Prints every
 * failed check, "ok" and exits 0 when all pass. */
#include <dirent.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

/* Children forked one after another. */
#define FORKS 1000

/* Sockets of process `pid` in the run directory. */
static int sockets_of(const char *dir, int pid)
{
	char prefix[32];
	snprintf(prefix, sizeof prefix, "%d.", pid);
	DIR *d = opendir(dir);
	if (!d)
		return -1;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		if (strncmp(e->d_name, prefix, strlen(prefix)) == 0 && strstr(e->d_name, ".sock"))
			n++;
	closedir(d);
	return n;
}

int main(void)
{
	const char *dir = getenv("ROCEV2_RUN_DIR");
	CHECK(dir != NULL);
	int num;
	struct ibv_device **list = ibv_get_device_list(&num);
	struct ibv_context *ctx = list && num == 1 ? ibv_open_device(list[0]) : NULL;
	CHECK(ctx != NULL);
	if (!ctx || !dir)
		return 1;
	/* A PD starts the runtime and its stats endpoint. */
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL);
	CHECK(sockets_of(dir, getpid()) == 1);
	/* Many children: the runtime's thread holds its lock at some forks (CI finding: a child that inherited the
	 * held lock waited for ever in ibv_dealloc_pd, about 1 fork in 500 here). */
	for (int i = 0; i < FORKS && !fails; i++) {
		fflush(stdout);
		fflush(stderr);
		pid_t child = fork();
		CHECK(child >= 0);
		if (child == 0) {
			/* The child closes what it inherited, then exits without running the parent's atexit work; one
			 * that is stuck ends by SIGALRM. */
			alarm(10);
			ibv_dealloc_pd(pd);
			ibv_close_device(ctx);
			_exit(0);
		}
		int status = 0;
		CHECK(waitpid(child, &status, 0) == child);
		if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0))
			printf("fork %d: child status %#x (SIGALRM: stuck)\n", i, status);
		CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
		CHECK(sockets_of(dir, getpid()) == 1);
	}
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	ibv_free_device_list(list);
	if (fails)
		return 1;
	puts("ok");
	return 0;
}
