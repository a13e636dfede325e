//! Fuzz target `parse_mad`: arbitrary bytes as a MAD (the payload of a GSI
//! datagram on QP1).
//!
//! Must never panic. On every input it runs the [`Mad`] view's accessors when
//! `new_checked` accepts the bytes, [`CmMad::parse`], every CM message parser
//! over the bytes as class data, and [`CmaHdr::parse`]; when [`CmMad::parse`]
//! succeeds it checks parse ∘ emit = id and that emitting twice gives the same
//! bytes.

#![no_main]

use std::hint::black_box;

use libfuzzer_sys::fuzz_target;
use roce_wire::cm::{CmaHdr, attr};
use roce_wire::mad::MAD_LEN;
use roce_wire::{CmMad, CmMessage, Mad, MadHeaderRepr};

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Mad::new_checked(data) {
        black_box((
            m.base_version(),
            m.mgmt_class(),
            m.class_version(),
            m.method(),
        ));
        black_box((
            m.status(),
            m.class_specific(),
            m.tid(),
            m.attr_id(),
            m.attr_mod(),
        ));
        black_box(m.data().len());
        black_box(MadHeaderRepr::parse(&m).unwrap());
    }
    for a in [
        attr::REQ,
        attr::MRA,
        attr::REJ,
        attr::REP,
        attr::RTU,
        attr::DREQ,
        attr::DREP,
        attr::SIDR_REQ,
        attr::SIDR_REP,
        attr::LAP,
    ] {
        let _ = black_box(CmMessage::parse(a, data));
    }
    let _ = black_box(CmaHdr::parse(data));
    if let Ok(mad) = CmMad::parse(data) {
        let _ = format!("{mad}");
        let mut out = [0u8; MAD_LEN];
        assert_eq!(mad.emit(&mut out).unwrap(), MAD_LEN);
        let back = CmMad::parse(&out).expect("re-parsing an emitted MAD failed");
        assert_eq!(back, mad, "round trip changed the MAD");
        let mut again = [0u8; MAD_LEN];
        back.emit(&mut again).unwrap();
        assert_eq!(again, out, "emit is not stable");
    }
});
