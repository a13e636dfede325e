/* rdma_listen when the libibverbs.so.1 loaded offers a private bridge table of another version
 * (tests/c/bridge_v3.c, preloaded by tests/c_edge.rs): the library must refuse the table, so the call fails with
 * ENODEV (the line on stderr that says why is checked by c_edge.rs). Prints "ok" on success. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

int main(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(7489) };

	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP)) {
		printf("set-up failed: %s\n", strerror(errno));
		return 1;
	}
	if (rdma_bind_addr(id, (struct sockaddr *)&a)) {
		printf("rdma_bind_addr: %s\n", strerror(errno));
		return 1;
	}
	errno = 0;
	if (rdma_listen(id, 1) == 0 || errno != ENODEV) {
		printf("rdma_listen: %s, want ENODEV\n", strerror(errno));
		return 1;
	}
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
	printf("ok\n");
	return 0;
}
