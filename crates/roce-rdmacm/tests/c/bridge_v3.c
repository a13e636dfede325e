/* A stand-in for the private bridge of a rocev2 libibverbs.so.1 of another build: it exports
 * rocev2_private_v1@ROCEV2_PRIVATE (tests/c_edge.rs links it with that symbol version and preloads it, so
 * librdmacm's dlvsym finds it before the real one) returning a table of version 3 with this build's size (version 3
 * had the layout of version 4; only the meaning of ConnectC.timeout and of CONNECT_RESPONSE's local_ack_timeout
 * changed: crate roce-abi, src/bridge.rs). Every function of the table answers -EPROTO, so a librdmacm that took
 * the table would fail rdma_listen with EPROTO instead of refusing it (ENODEV and one line on stderr). */
#include <errno.h>
#include <stdint.h>

static long refuse(void)
{
	return -EPROTO;
}

#define FUNCTIONS 15

struct table {
	uint32_t version;
	uint32_t size;
	long (*fn[FUNCTIONS])(void);
};

static struct table table = {
	.version = 3,
	.size = sizeof(struct table),
	.fn = { refuse, refuse, refuse, refuse, refuse, refuse, refuse, refuse, refuse, refuse, refuse, refuse, refuse,
		refuse, refuse },
};

_Static_assert(sizeof(struct table) == 128, "the size of the table of versions 3 and 4");

const struct table *rocev2_private_v1(void)
{
	return &table;
}
