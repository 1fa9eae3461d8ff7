use super::*;

#[test]
fn handle_round_trip_and_refusals() {
    let h = encode_handle(b"ccl-shm/1/abc");
    assert_eq!(decode_handle(&h).unwrap(), b"ccl-shm/1/abc");
    assert!(decode_handle(&Handle::new(b"CT\x01\x04").unwrap()).is_err());
    assert!(decode_handle(&encode_handle(b"")).is_err());
}
