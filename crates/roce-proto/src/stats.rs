//! Counters: plain `u64` fields (STYLE E9), named as operators know them from `rdma statistic` (rxe hw counters,
//! mlx5 hw counters, S11), plus drop counters by reason. One [`Counters`] per port and one per QP; the port set is
//! the sum over QPs plus what belongs to no QP: drops before a QP is known (`rx_icrc_encapsulated`,
//! `drop_malformed`, `drop_wrong_dest_ip`, `drop_pkey_mismatch`, `drop_unknown_qp` for an unknown QPN) and the port
//! and CQ events `link_downed` and `cq_overflow` (tested by the engine's unit tests, `assert_counters_add_up`).
//! List them with [`Counters::iter`].

macro_rules! counters {
    ($( $(#[$m:meta])* $name:ident, )*) => {
        /// A set of counters. Field names are the exported names.
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct Counters {
            $( $(#[$m])* pub $name: u64, )*
        }
        impl Counters {
            /// All counter names, in export order.
            pub const NAMES: &'static [&'static str] = &[$(stringify!($name),)*];
            /// `(name, value)` pairs in export order (for `--stats` and Prometheus).
            pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
                [$((stringify!($name), self.$name),)*].into_iter()
            }
            /// Value of the counter called `name`.
            pub fn get(&self, name: &str) -> Option<u64> {
                match name {
                    $(stringify!($name) => Some(self.$name),)*
                    _ => None,
                }
            }
        }
    };
}

counters! {
    /// Packets transmitted (rxe `sent_pkts`), including retransmissions, ACKs and CNPs.
    sent_pkts,
    /// Packets received and accepted by a QP (rxe `rcvd_pkts`).
    rcvd_pkts,
    /// Bytes of transmitted frames.
    sent_bytes,
    /// Bytes of received frames handed to a QP.
    rcvd_bytes,
    /// Duplicate requests seen by the responder (rxe `duplicate_request`).
    duplicate_request,
    /// Requests with PSN ahead of the expected PSN (rxe `out_of_seq_request`).
    out_of_seq_request,
    /// RNR NAKs received by the requester (rxe `rcvd_rnr_err`).
    rcvd_rnr_err,
    /// RNR NAKs sent by the responder (rxe `send_rnr_err`).
    send_rnr_err,
    /// PSN sequence error NAKs received by the requester (rxe `rcvd_seq_err`).
    rcvd_seq_err,
    /// Executed requests without AckReq whose ACK was deferred/coalesced (rxe `ack_deferred`).
    ack_deferred,
    /// WRs completed with RETRY_EXC_ERR (rxe `retry_exceeded_err`).
    retry_exceeded_err,
    /// WRs completed with RNR_RETRY_EXC_ERR (rxe `retry_rnr_exceeded_err`).
    retry_rnr_exceeded_err,
    /// Requester retries started (timeouts, sequence NAKs, implied NAKs; rxe `completer_retry_err`).
    completer_retry_err,
    /// Error completions of send WRs, except flushes (rxe `send_err`).
    send_err,
    /// Link-down events reported by the driver through `Engine::handle_link_change` (rxe `link_downed`).
    link_downed,
    /// Send WRs of a SEND opcode (SEND, SEND with immediate, SEND with invalidate) completed by the requester, with
    /// success or an error but not flushed (rxe `rdma_sends`, counted in rxe_comp.c `do_complete`).
    rdma_sends,
    /// Receive WRs completed successfully by the responder: a SEND message received whole, or an RDMA WRITE with
    /// immediate (rxe `rdma_recvs`, counted in rxe_resp.c `do_complete`). Executed READ/WRITE requests are
    /// `rx_read_requests` / `rx_write_requests`.
    rdma_recvs,
    /// Local ACK timer expirations (mlx5 `local_ack_timeout_err`), one per expiry that retransmits or gives up.
    local_ack_timeout_err,
    /// NAK sequence errors received (mlx5 `packet_seq_err`).
    packet_seq_err,
    /// Implied NAKs (a response beyond an unanswered READ/atomic, mlx5 `implied_nak_seq_err`).
    implied_nak_seq_err,
    /// Received RoCE packets with a bad ICRC (mlx5 `rx_icrc_encapsulated`), dropped silently (S20).
    rx_icrc_encapsulated,
    /// CNPs sent by the notification point (mlx5 `np_cnp_sent`).
    np_cnp_sent,
    /// CNPs received and acted on by the reaction point (mlx5 `rp_cnp_handled`).
    rp_cnp_handled,
    /// CNPs received for a QP without a reaction point (DCQCN off; mlx5 `rp_cnp_ignored`).
    rp_cnp_ignored,
    /// CE-marked RoCE packets received (mlx5 `np_ecn_marked_roce_packets`).
    np_ecn_marked_roce_packets,
    /// Out-of-sequence packets seen (mlx5 `out_of_sequence`, responder side).
    out_of_sequence,
    /// RDMA READ requests executed by the responder (mlx5 `rx_read_requests`).
    rx_read_requests,
    /// RDMA WRITE messages executed by the responder (mlx5 `rx_write_requests`).
    rx_write_requests,
    /// Atomic requests executed by the responder (mlx5 `rx_atomic_requests`).
    rx_atomic_requests,
    /// NAK remote access error received by the requester (mlx5 `req_remote_access_errors`).
    req_remote_access_errors,
    /// NAK invalid request received by the requester (mlx5 `req_remote_invalid_request`).
    req_remote_invalid_request,
    /// Receive WRs too small for an incoming message (mlx5 `resp_local_length_error`).
    resp_local_length_error,
    /// NAK remote access error sent by the responder (mlx5 `resp_remote_access_errors`).
    resp_remote_access_errors,
    /// Accesses to registered memory that faulted because the application unmapped or protected it (roce-verbs'
    /// fault-tolerant copies, issue #21): each failed the remote request it served (NAK) or the local WR it served
    /// (LOC_PROT_ERR), and the QP went to the error state ([`MemoryFault`](crate::MemoryFault)).
    mr_access_faults,
    /// Packets retransmitted by go-back-N.
    retransmitted_pkts,
    /// NAKs sent with a class A/C error (0x61-0x63).
    resp_nak_sent,
    /// Completions lost because a CQ was full (each also raises an `CqErr` async event).
    cq_overflow,
    /// `poll_transmit` calls refused because the caller's buffer was too small (nothing consumed, S05).
    tx_refused,
    /// Drop: frame is not RoCE v2 (EtherType, IP protocol, UDP port) or is truncated/malformed (incl. TVer ≠ 0,
    /// bad pad count, lengths that disagree — `roce_wire::RoceRepr::parse`).
    drop_malformed,
    /// Drop: BTH opcode unknown or not valid for the QP type.
    drop_bad_opcode,
    /// Drop: destination QP unknown or in a state that does not accept packets.
    drop_unknown_qp,
    /// Drop: IP addresses do not match the connected QP's address vector.
    drop_wrong_peer,
    /// Drop: destination IP is not in the GID table.
    drop_wrong_dest_ip,
    /// Drop: P_Key mismatch.
    drop_pkey_mismatch,
    /// Drop: UD Q_Key mismatch.
    drop_qkey_mismatch,
    /// Drop: UD payload larger than the posted receive buffer (S07), QP stays RTS.
    drop_ud_too_long,
    /// Drop: UD packet with no receive WR posted.
    drop_ud_no_recv,
    /// Drop: UC packet outside the current message (gap; resynchronised at the next FIRST/ONLY).
    drop_uc_out_of_seq,
    /// Drop: UC request packets of a message that found no receive WQE (a SEND FIRST/ONLY, or the LAST/ONLY of an
    /// RDMA WRITE with immediate), and the MIDDLE/LAST packets that follow such a FIRST. UC has no RNR NAK (IBTA;
    /// `docs/spec/ROCEV2.md` §5 sends an RNR NAK only on RC): the message is silently dropped, ePSN moves past
    /// it and the QP stays in RTS (rxe `rxe_resp.c` `RESPST_ERR_RNR`: UD/UC class D, drop the message, no counter).
    /// The sender is not told: a receiver that replenishes its receives slower than the sender posts SENDs shows it
    /// here. Not a PSN gap: those are `drop_uc_out_of_seq` (mlx5 counts both kinds of lack of a WQE in its
    /// per-queue `out_of_buffer`).
    drop_uc_no_recv,
    /// Drop: a response beyond every PSN ever sent (ghost), a READ response or ATOMIC ACK with nothing outstanding,
    /// or a duplicate READ request that matches no saved READ. Responses older than the oldest unacknowledged PSN
    /// are harmless duplicates, not drops: they count as `duplicate_response`.
    drop_stale_response,
    /// Responses (ACK, NAK, READ response, ATOMIC ACK) with a PSN below the requester's oldest unacknowledged PSN,
    /// ignored as duplicates (`docs/spec/ROCEV2.md` §4.4 "duplicate/old ACK: ignore"; rxe `rxe_comp.c`
    /// `check_psn`: an older PSN ends the completer's work on the packet, without a counter). The responder sends
    /// them for every duplicate request it re-ACKs (typically una−1), and for a re-requested READ whose responses
    /// had already arrived; a requester busy with many of them shows it here. Not a drop: nothing was lost.
    duplicate_response,
    /// Bytes of sending credit the QP's token bucket discarded at its depth while the QP had frames waiting
    /// (`crate::sched::shaper`, "credit lost while backlogged"; the depth cap is `docs/spec/DCQCN.md §7 TB1`,
    /// the depth `TB3`). A QP limited to `r` sends `r·T + depth − this` at most over `T`: a non-zero value means the
    /// engine was not driven for longer than `depth / r` (a descheduled thread on a loaded host), the PSN window
    /// was closed (the peer's ACKs late) or a class/port bucket or other QPs held the QP back — not that the shaper
    /// is off. Idle overflow and the `TB5` clamp on a rate
    /// cut are not counted; a lower bound (a QP counts as waiting from the first scheduling decision after a post).
    /// Updated when the QP is scheduled, parked, unparked or re-rated.
    shaper_credit_lost_bytes,
    /// The same for the port bucket (`SchedConfig::port_rate_bps`, `DCQCN.md §9 S5`) while anything was queued to
    /// send; port-level only (0 per QP; always 0 without a port rate).
    port_shaper_credit_lost_bytes,
}
