//! A minimal canonical CBOR (RFC 8949) encoder: exactly what block hashing
//! needs and nothing more.
//!
//! Supported items: unsigned and negative integers (64-bit range), byte
//! strings, UTF-8 text strings, definite-length arrays and `null`. Every head
//! uses the shortest form ("preferred serialization"), and every length is
//! definite, which is what Python's `cbor2.dumps(obj, canonical=True)` emits
//! for these types. Maps, floats, tags and indefinite lengths are not
//! supported because the block-hash payload never contains them.
//!
//! [`CborBuf`] writes into a `Vec<u8>` that is cleared and reused between
//! payloads, so steady-state encoding never allocates.

/// Major type 0: unsigned integer.
const MAJOR_UINT: u8 = 0;
/// Major type 1: negative integer (`-1 - n`).
const MAJOR_NINT: u8 = 1;
/// Major type 2: byte string.
const MAJOR_BYTES: u8 = 2;
/// Major type 3: UTF-8 text string.
const MAJOR_TEXT: u8 = 3;
/// Major type 4: array.
const MAJOR_ARRAY: u8 = 4;
/// The simple value `null` (major type 7, value 22).
const NULL: u8 = 0xf6;

/// A reusable output buffer for canonical CBOR.
#[derive(Debug, Default, Clone)]
pub struct CborBuf {
    buf: Vec<u8>,
}

impl CborBuf {
    /// An empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty buffer with room for `capacity` bytes.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            buf: Vec::with_capacity(capacity),
        }
    }

    /// Forget the contents, keeping the allocation.
    #[inline]
    pub fn clear(&mut self) {
        self.buf.clear();
    }

    /// The encoded bytes so far.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Reserve room for `additional` more bytes.
    #[inline]
    pub fn reserve(&mut self, additional: usize) {
        self.buf.reserve(additional);
    }

    /// Write a head: major type and argument, in the shortest form.
    #[inline]
    fn head(&mut self, major: u8, arg: u64) {
        let m = major << 5;
        if arg < 24 {
            self.buf.push(m | arg as u8);
        } else if let Ok(v) = u8::try_from(arg) {
            self.buf.extend_from_slice(&[m | 0x18, v]);
        } else if let Ok(v) = u16::try_from(arg) {
            let b = v.to_be_bytes();
            self.buf.extend_from_slice(&[m | 0x19, b[0], b[1]]);
        } else if let Ok(v) = u32::try_from(arg) {
            let b = v.to_be_bytes();
            self.buf
                .extend_from_slice(&[m | 0x1a, b[0], b[1], b[2], b[3]]);
        } else {
            self.buf.push(m | 0x1b);
            self.buf.extend_from_slice(&arg.to_be_bytes());
        }
    }

    /// Append raw bytes that are not a CBOR item (used by the native hash
    /// format, which shares this buffer).
    #[inline]
    pub fn raw(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }

    /// An unsigned integer.
    #[inline]
    pub fn uint(&mut self, v: u64) {
        self.head(MAJOR_UINT, v);
    }

    /// A signed integer: major type 0 when non-negative, else major type 1
    /// with argument `-1 - v`.
    #[inline]
    pub fn int(&mut self, v: i64) {
        match u64::try_from(v) {
            Ok(u) => self.head(MAJOR_UINT, u),
            // For v < 0 the argument is -1 - v == |v| - 1 (no overflow at i64::MIN).
            Err(_) => self.head(MAJOR_NINT, v.unsigned_abs() - 1),
        }
    }

    /// A byte string.
    #[inline]
    pub fn bytes(&mut self, b: &[u8]) {
        self.head(MAJOR_BYTES, b.len() as u64);
        self.buf.extend_from_slice(b);
    }

    /// A text string (Rust strings are always valid UTF-8).
    #[inline]
    pub fn text(&mut self, s: &str) {
        self.head(MAJOR_TEXT, s.len() as u64);
        self.buf.extend_from_slice(s.as_bytes());
    }

    /// The head of a definite-length array of `len` items; the caller writes
    /// exactly `len` items next.
    #[inline]
    pub fn array(&mut self, len: usize) {
        self.head(MAJOR_ARRAY, len as u64);
    }

    /// `null`.
    #[inline]
    pub fn null(&mut self) {
        self.buf.push(NULL);
    }

    /// An array of unsigned 32-bit integers (the token ids of a block).
    ///
    /// Branch-free per item: token ids of a real vocabulary straddle the
    /// 3- and 5-byte forms at random, so a branch per item would mispredict
    /// often. Items are encoded 16 at a time into a stack buffer: each one
    /// is assembled in a `u64` (initial byte first in memory order) and
    /// stored as 8 bytes at a masked offset (so no bounds check is needed),
    /// and the position advances by the item's true length.
    #[inline]
    pub fn u32_array(&mut self, items: &[u32]) {
        /// Argument bytes per size class (value < 24, < 2^8, < 2^16, else).
        const ARG_BYTES: [u32; 4] = [0, 1, 2, 4];
        /// Initial byte per class; class 0 carries the value itself.
        const INITIAL: [u8; 4] = [0x00, 0x18, 0x19, 0x1a];
        /// Keep the value's low bits in the initial byte only for class 0.
        const KEEP: [u8; 4] = [0xff, 0, 0, 0];
        const CHUNK: usize = 16;
        // At most 5 * 16 = 80 bytes per chunk; offsets are masked to 127
        // (a no-op since they stay below 80) and each store is 8 bytes.
        const MASK: usize = 127;
        self.array(items.len());
        let mut tmp = [0u8; MASK + 1 + 8];
        for chunk in items.chunks(CHUNK) {
            let mut n = 0usize;
            for &t in chunk {
                let class =
                    usize::from(t >= 24) + usize::from(t >= 0x100) + usize::from(t >= 0x1_0000);
                let k = ARG_BYTES[class];
                // The low `k` bytes of `t`, big-endian, first in memory order.
                let arg = u64::from(t.swap_bytes()) >> (32 - 8 * k);
                let initial = INITIAL[class] | (t as u8 & KEEP[class]);
                let word = u64::from(initial) | (arg << 8);
                let at = n & MASK;
                tmp[at..at + 8].copy_from_slice(&word.to_le_bytes());
                n += 1 + k as usize;
            }
            self.buf.extend_from_slice(&tmp[..n]);
        }
    }

    /// Append `items` as raw little-endian u32s (not a CBOR item; used by
    /// the native hash format).
    #[inline]
    pub fn raw_u32_le(&mut self, items: &[u32]) {
        let base = self.buf.len();
        self.buf.resize(base + items.len() * 4, 0);
        for (dst, t) in self.buf[base..].chunks_exact_mut(4).zip(items) {
            dst.copy_from_slice(&t.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        crate::block_hash::to_hex(b)
    }

    fn enc(f: impl FnOnce(&mut CborBuf)) -> String {
        let mut c = CborBuf::new();
        f(&mut c);
        hex(c.as_bytes())
    }

    // Expected values are the examples of RFC 8949 appendix A.
    #[test]
    fn unsigned_heads_are_shortest() {
        for (v, want) in [
            (0u64, "00"),
            (1, "01"),
            (10, "0a"),
            (23, "17"),
            (24, "1818"),
            (25, "1819"),
            (100, "1864"),
            (255, "18ff"),
            (256, "190100"),
            (1000, "1903e8"),
            (65535, "19ffff"),
            (65536, "1a00010000"),
            (1_000_000, "1a000f4240"),
            (u64::from(u32::MAX), "1affffffff"),
            (1 << 32, "1b0000000100000000"),
            (1_000_000_000_000, "1b000000e8d4a51000"),
            (u64::MAX, "1bffffffffffffffff"),
        ] {
            assert_eq!(enc(|c| c.uint(v)), want, "{v}");
        }
    }

    #[test]
    fn signed_ints() {
        for (v, want) in [
            (0i64, "00"),
            (-1, "20"),
            (-10, "29"),
            (-24, "37"),
            (-25, "3818"),
            (-100, "3863"),
            (-256, "38ff"),
            (-257, "390100"),
            (-1000, "3903e7"),
            (-65537, "3a00010000"),
            (i64::MIN, "3b7fffffffffffffff"),
            (i64::MAX, "1b7fffffffffffffff"),
        ] {
            assert_eq!(enc(|c| c.int(v)), want, "{v}");
        }
    }

    #[test]
    fn strings_and_arrays() {
        assert_eq!(enc(|c| c.bytes(&[])), "40");
        assert_eq!(enc(|c| c.bytes(&[1, 2, 3, 4])), "4401020304");
        assert_eq!(enc(|c| c.text("")), "60");
        assert_eq!(enc(|c| c.text("a")), "6161");
        assert_eq!(enc(|c| c.text("IETF")), "6449455446");
        assert_eq!(enc(|c| c.text("\u{fc}")), "62c3bc");
        assert_eq!(enc(|c| c.text("\u{6c34}")), "63e6b0b4");
        assert_eq!(enc(|c| c.array(0)), "80");
        assert_eq!(enc(CborBuf::null), "f6");
        assert_eq!(enc(|c| c.u32_array(&[1, 2, 3])), "83010203");
        // [1, [2, 3], [4, 5]]
        let nested = enc(|c| {
            c.array(3);
            c.uint(1);
            c.u32_array(&[2, 3]);
            c.u32_array(&[4, 5]);
        });
        assert_eq!(nested, "8301820203820405");
        // 25 items: the length needs a one-byte argument.
        let long: Vec<u32> = (1..=25).collect();
        let want = format!(
            "9819{}",
            (1..=25)
                .map(|i| if i < 24 {
                    format!("{i:02x}")
                } else {
                    format!("18{i:02x}")
                })
                .collect::<String>()
        );
        assert_eq!(enc(|c| c.u32_array(&long)), want);
    }

    #[test]
    fn u32_array_matches_uint_per_item() {
        let edges = [
            0u32,
            1,
            23,
            24,
            25,
            255,
            256,
            257,
            65_535,
            65_536,
            65_537,
            199_999,
            u32::MAX,
            7,
        ];
        let mut want = CborBuf::new();
        want.array(edges.len());
        for &e in &edges {
            want.uint(u64::from(e));
        }
        let mut got = CborBuf::new();
        got.text("x");
        got.clear();
        got.u32_array(&edges);
        assert_eq!(got.as_bytes(), want.as_bytes());
        let mut raw = CborBuf::new();
        raw.raw_u32_le(&[1, 0x0102_0304]);
        assert_eq!(raw.as_bytes(), &[1, 0, 0, 0, 4, 3, 2, 1]);
    }

    #[test]
    fn long_string_lengths() {
        let s = "x".repeat(300);
        let e = enc(|c| c.text(&s));
        assert!(e.starts_with("79012c"));
        assert_eq!(e.len(), 2 * (3 + 300));
        let b = vec![0u8; 70_000];
        let mut c = CborBuf::new();
        c.bytes(&b);
        assert_eq!(&c.as_bytes()[..5], &[0x5a, 0x00, 0x01, 0x11, 0x70]);
    }

    #[test]
    fn clear_reuses_buffer() {
        let mut c = CborBuf::with_capacity(64);
        c.text("abc");
        c.clear();
        assert!(c.as_bytes().is_empty());
        c.uint(7);
        assert_eq!(c.as_bytes(), &[7]);
    }
}
