// Included (`include!`) by tests/perftest_compat.rs and the unit tests in src/oob.rs, so both read the
// perftest capture the same way.

/// TCP payloads of `testdata/interop/captures/perftest_tcp_exchange.pcap`, in order: (client → server?, bytes).
#[allow(unused_qualifications)] // the includers differ in what they import
pub fn perftest_capture() -> Vec<(bool, Vec<u8>)> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/interop/captures/perftest_tcp_exchange.pcap");
    let f = std::fs::File::open(&path).expect("the perftest capture in testdata/interop/captures");
    let mut rd = pcap_file::pcap::PcapReader::new(f).expect("pcap");
    let mut out = Vec::new();
    while let Some(p) = rd.next_packet() {
        let p = p.expect("packet");
        let d = &p.data;
        if d.len() < 54 || d[12..14] != [8, 0] || d[23] != 6 {
            continue;
        }
        let ip = &d[14..];
        let ihl = usize::from(ip[0] & 15) * 4;
        let tot = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
        let tcp = &ip[ihl..];
        let off = usize::from(tcp[12] >> 4) * 4;
        let dport = u16::from_be_bytes([tcp[2], tcp[3]]);
        let payload = &ip[ihl + off..tot];
        if !payload.is_empty() {
            out.push((dport == 18515, payload.to_vec()));
        }
    }
    out
}
