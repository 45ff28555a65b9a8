//! `cargo +nightly fuzz run parse` (from proto/): the parsers never panic, and whatever they
//! accept re-encodes to the very bytes they were given.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rblk_proto::{parse, parse_connect_data, peek_tag, CONNECT_DATA_LEN, MSG_SIZE};

fuzz_target!(|data: &[u8]| {
    let _ = peek_tag(data);
    if let Ok((tag, msg)) = parse(data) {
        let mut out = [0u8; MSG_SIZE];
        let len = msg.encode(tag, &mut out).expect("a parsed message encodes");
        assert_eq!(&out[..len], data);
    }
    if let Ok(connect) = parse_connect_data(data) {
        assert_eq!(connect.to_bytes()[..], data[..CONNECT_DATA_LEN]);
    }
});
