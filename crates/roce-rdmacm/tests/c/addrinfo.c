/* rdma_getaddrinfo as rdma-core's librdmacm/addrinfo.c answers it (run by tests/c_edge.rs; no device needed):
 *
 *  - no node, no service, only hints (libfabric's verbs provider asks so for a passive endpoint: the source address
 *    in ai_src_addr, RAI_PASSIVE): the result copies the hints' flags, family, QP type and port space and their
 *    addresses; no node, no service and no hints is EINVAL;
 *  - node and service, passive: the address is the source, RAI_PASSIVE set;
 *  - node and service, active: the address is the destination and the hints' source address is kept;
 *  - the QP type follows the hints, else the socket type (RC for a stream, UD for a datagram); the port space
 *    likewise (RDMA_PS_TCP, RDMA_PS_UDP).
 * Prints "ok" and exits 0 when every check passed. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

#include "check.h"

static struct sockaddr_in in4(const char *ip, uint16_t port)
{
	struct sockaddr_in a;
	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_port = htons(port);
	inet_pton(AF_INET, ip, &a.sin_addr);
	return a;
}

static int same_in4(const struct sockaddr *s, socklen_t len, const struct sockaddr_in *want)
{
	const struct sockaddr_in *a = (const struct sockaddr_in *)s;
	return s && len == sizeof(*want) && a->sin_family == AF_INET && a->sin_port == want->sin_port &&
	       a->sin_addr.s_addr == want->sin_addr.s_addr;
}

int main(void)
{
	struct rdma_addrinfo hints, *res = NULL;
	struct sockaddr_in src = in4("198.18.24.1", 7471), dst = in4("198.18.24.2", 7472);

	/* Nothing at all. */
	errno = 0;
	CHECK(rdma_getaddrinfo(NULL, NULL, NULL, &res) == -1 && errno == EINVAL);

	/* Hints only, passive (libfabric verbs: vrb_get_rdmacm_rai for FI_SOURCE). */
	memset(&hints, 0, sizeof(hints));
	hints.ai_flags = RAI_PASSIVE;
	hints.ai_family = AF_INET;
	hints.ai_qp_type = IBV_QPT_RC;
	hints.ai_port_space = RDMA_PS_TCP;
	hints.ai_src_addr = (struct sockaddr *)&src;
	hints.ai_src_len = sizeof(src);
	res = NULL;
	CHECK(rdma_getaddrinfo(NULL, NULL, &hints, &res) == 0 && res);
	if (res) {
		CHECK(res->ai_flags == RAI_PASSIVE);
		CHECK(res->ai_family == AF_INET);
		CHECK(res->ai_qp_type == IBV_QPT_RC);
		CHECK(res->ai_port_space == RDMA_PS_TCP);
		CHECK(same_in4(res->ai_src_addr, res->ai_src_len, &src));
		CHECK(res->ai_src_addr != (struct sockaddr *)&src);
		CHECK(res->ai_dst_addr == NULL && res->ai_dst_len == 0);
		CHECK(res->ai_next == NULL);
		rdma_freeaddrinfo(res);
	}

	/* Hints only, active, both addresses. */
	hints.ai_flags = 0;
	hints.ai_dst_addr = (struct sockaddr *)&dst;
	hints.ai_dst_len = sizeof(dst);
	res = NULL;
	CHECK(rdma_getaddrinfo(NULL, NULL, &hints, &res) == 0 && res);
	if (res) {
		CHECK(same_in4(res->ai_src_addr, res->ai_src_len, &src));
		CHECK(same_in4(res->ai_dst_addr, res->ai_dst_len, &dst));
		rdma_freeaddrinfo(res);
	}

	/* Node and service, passive: the source. */
	memset(&hints, 0, sizeof(hints));
	hints.ai_flags = RAI_PASSIVE | RAI_NUMERICHOST;
	hints.ai_port_space = RDMA_PS_TCP;
	res = NULL;
	CHECK(rdma_getaddrinfo("198.18.24.1", "7471", &hints, &res) == 0 && res);
	if (res) {
		CHECK(res->ai_flags & RAI_PASSIVE);
		CHECK(res->ai_qp_type == IBV_QPT_RC);
		CHECK(res->ai_port_space == RDMA_PS_TCP);
		CHECK(same_in4(res->ai_src_addr, res->ai_src_len, &src));
		CHECK(res->ai_dst_addr == NULL);
		rdma_freeaddrinfo(res);
	}

	/* Node and service, active, with a source in the hints: both. */
	memset(&hints, 0, sizeof(hints));
	hints.ai_flags = RAI_NUMERICHOST;
	hints.ai_src_addr = (struct sockaddr *)&src;
	hints.ai_src_len = sizeof(src);
	res = NULL;
	CHECK(rdma_getaddrinfo("198.18.24.2", "7472", &hints, &res) == 0 && res);
	if (res) {
		CHECK(!(res->ai_flags & RAI_PASSIVE));
		CHECK(res->ai_qp_type == IBV_QPT_RC);
		CHECK(res->ai_port_space == RDMA_PS_TCP);
		CHECK(same_in4(res->ai_dst_addr, res->ai_dst_len, &dst));
		CHECK(same_in4(res->ai_src_addr, res->ai_src_len, &src));
		rdma_freeaddrinfo(res);
	}

	/* A UD QP type without a port space: RDMA_PS_UDP. */
	memset(&hints, 0, sizeof(hints));
	hints.ai_flags = RAI_NUMERICHOST;
	hints.ai_qp_type = IBV_QPT_UD;
	res = NULL;
	CHECK(rdma_getaddrinfo("198.18.24.2", "7472", &hints, &res) == 0 && res);
	if (res) {
		CHECK(res->ai_qp_type == IBV_QPT_UD);
		CHECK(res->ai_port_space == RDMA_PS_UDP);
		rdma_freeaddrinfo(res);
	}

	if (fails)
		return 1;
	printf("ok\n");
	return 0;
}
