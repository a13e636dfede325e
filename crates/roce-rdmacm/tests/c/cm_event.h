/* The rdma_cm event helpers of the C test programs (include after check.h): `expect(ch, type)` waits for the next
 * event of `ch` for at most CM_EVENT_TIMEOUT_MS (define it before the include; 5000 by default), checks that it is
 * `type` (naming both on stderr when not) and returns it unacknowledged, NULL after a failed check; `expect_ack` also
 * acknowledges it. */
#ifndef ROCEV2_TEST_CM_EVENT_H
#define ROCEV2_TEST_CM_EVENT_H
#include <poll.h>
#include <stdio.h>
#include <rdma/rdma_cma.h>

#ifndef CM_EVENT_TIMEOUT_MS
#define CM_EVENT_TIMEOUT_MS 5000
#endif

static inline struct rdma_cm_event *expect(struct rdma_event_channel *ch, enum rdma_cm_event_type type)
{
	struct pollfd p = {.fd = ch->fd, .events = POLLIN};
	struct rdma_cm_event *ev = NULL;
	int n = poll(&p, 1, CM_EVENT_TIMEOUT_MS);
	CHECK(n == 1);
	if (n != 1)
		return NULL;
	CHECK(rdma_get_cm_event(ch, &ev) == 0);
	if (!ev)
		return NULL;
	if (ev->event != type)
		fprintf(stderr, "expected %s, got %s (status %d)\n", rdma_event_str(type), rdma_event_str(ev->event),
			ev->status);
	CHECK(ev->event == type);
	return ev;
}

static inline void expect_ack(struct rdma_event_channel *ch, enum rdma_cm_event_type type)
{
	struct rdma_cm_event *ev = expect(ch, type);
	if (ev)
		CHECK(rdma_ack_cm_event(ev) == 0);
}
#endif
