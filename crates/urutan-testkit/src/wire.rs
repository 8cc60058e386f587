//! AMQP 0-9-1 wire encoding of what a hostile producer sends, built by hand
//! and without recursion (lapin's own serializer, and its `Drop`, recurse
//! once per nesting level, and lapin refuses to send a short string that is
//! not UTF-8). Shared by the pure suite (`tests/hostile.rs`) and the raw
//! publisher of the integration tests (`tests/it/raw_amqp.rs`).

/// Appends a short string: a length octet, then the bytes (at most 255).
pub fn shortstr(out: &mut Vec<u8>, s: &[u8]) {
    out.push(u8::try_from(s.len()).expect("a short string is at most 255 bytes"));
    out.extend_from_slice(s);
}

/// Appends a long string: a 32-bit length, then the bytes.
pub fn longstr(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&u32::try_from(s.len()).expect("long string").to_be_bytes());
    out.extend_from_slice(s);
}

/// The encoded value (type octet included) of a long string.
pub fn text(s: &[u8]) -> Vec<u8> {
    let mut out = vec![b'S'];
    longstr(&mut out, s);
    out
}

/// An encoded field table (length prefix included) of `entries`: each a
/// key (any bytes, not necessarily UTF-8) and an encoded value.
pub fn table(entries: &[(&[u8], Vec<u8>)]) -> Vec<u8> {
    let mut content = Vec::new();
    for (key, value) in entries {
        shortstr(&mut content, key);
        content.extend_from_slice(value);
    }
    let mut out = Vec::with_capacity(4 + content.len());
    longstr(&mut out, &content);
    out
}

/// The encoded value (type octet included) of `leaf` (an encoded value)
/// wrapped in `levels` tables and arrays, outermost first; level `i` is an
/// array when `array_at(i)`, else a table with the single key `k`. Built
/// in one pass, outside in: each level's length is known from the sizes
/// below it, so 20,000 levels cost 100 KB, not 20,000 copies.
pub fn nested(levels: usize, array_at: impl Fn(usize) -> bool, leaf: &[u8]) -> Vec<u8> {
    // Size of the encoded value at each level, innermost last.
    let mut sizes = vec![0usize; levels + 1];
    sizes[levels] = leaf.len();
    for level in (0..levels).rev() {
        let key = if array_at(level) { 0 } else { 2 };
        sizes[level] = 1 + 4 + key + sizes[level + 1];
    }
    let mut out = Vec::with_capacity(sizes[0]);
    for (level, inner) in sizes.iter().skip(1).enumerate() {
        let array = array_at(level);
        out.push(if array { b'A' } else { b'F' });
        let content = if array { *inner } else { 2 + inner };
        out.extend_from_slice(&u32::try_from(content).expect("size").to_be_bytes());
        if !array {
            shortstr(&mut out, b"k");
        }
    }
    out.extend_from_slice(leaf);
    out
}

/// Basic properties as a content header carries them (property flags
/// first): `headers` (an encoded table), delivery mode 2 (persistent) and
/// `message_id` as raw bytes.
pub fn properties(headers: &[u8], message_id: &[u8]) -> Vec<u8> {
    let mut out = (0x2000u16 | 0x1000 | 0x0080).to_be_bytes().to_vec();
    out.extend_from_slice(headers);
    out.push(2);
    shortstr(&mut out, message_id);
    out
}
