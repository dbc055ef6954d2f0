//! `BlockHash`: the digest that identifies a full block's token prefix.

use std::fmt;

use crate::error::{KvError, KvResult};

/// Largest digest kvcoord stores (SHA-256).
pub const MAX_DIGEST_LEN: usize = 32;

/// Lower-case hexadecimal of `bytes` (how the conformance vectors and logs
/// show digests).
pub fn to_hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// A block hash: a 16-byte (XXH3-128) or 32-byte (SHA-256) digest, stored
/// inline so that hashes never allocate.
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash {
    /// Digest bytes; bytes past `len` are zero (so derived `Eq`/`Hash` are exact).
    bytes: [u8; MAX_DIGEST_LEN],
    /// Digest length: 16 or 32.
    len: u8,
}

impl BlockHash {
    /// Wrap a digest, checking its length.
    pub fn from_slice(digest: &[u8]) -> KvResult<Self> {
        match digest.len() {
            16 | 32 => {
                let mut bytes = [0u8; MAX_DIGEST_LEN];
                bytes[..digest.len()].copy_from_slice(digest);
                Ok(Self {
                    bytes,
                    len: digest.len() as u8,
                })
            }
            other => Err(KvError::InvalidHashLength(other)),
        }
    }

    /// The digest bytes.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    /// Digest length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Always false: a digest has 16 or 32 bytes.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// vLLM's external form of a hash in KV events
    /// (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`, on by default): the digest's
    /// last 8 bytes read as a big-endian integer.
    pub fn external(&self) -> u64 {
        let b = self.as_bytes();
        let mut last = [0u8; 8];
        last.copy_from_slice(&b[b.len() - 8..]);
        u64::from_be_bytes(last)
    }

    /// The digests of `hashes` concatenated (`len * digest length` bytes),
    /// reserved fallibly: a request's hashes are sized by its caller.
    pub fn concat(hashes: &[Self]) -> crate::KvResult<Vec<u8>> {
        let bytes = hashes.iter().map(Self::len).sum();
        let digests = hashes.iter().flat_map(Self::as_bytes).copied();
        crate::limits::try_collect(bytes, digests, "block hash digests")
    }
}

impl fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlockHash(")?;
        for b in self.as_bytes() {
            write!(f, "{b:02x}")?;
        }
        write!(f, ")")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn external_form_and_concat() {
        let mut d = [0u8; 32];
        d[24..].copy_from_slice(&0x0102_0304_0506_0708u64.to_be_bytes());
        let h = super::BlockHash::from_slice(&d).unwrap();
        assert_eq!(h.external(), 0x0102_0304_0506_0708);
        let both = super::BlockHash::concat(&[h, h]).unwrap();
        assert_eq!(both.len(), 64);
        assert_eq!(&both[32..], &d);
    }

    use super::*;

    #[test]
    fn lengths() {
        assert_eq!(BlockHash::from_slice(&[1; 16]).unwrap().len(), 16);
        assert_eq!(
            BlockHash::from_slice(&[1; 32]).unwrap().as_bytes(),
            &[1; 32]
        );
        assert_eq!(
            BlockHash::from_slice(&[1; 20]),
            Err(KvError::InvalidHashLength(20))
        );
        assert_eq!(
            BlockHash::from_slice(&[]),
            Err(KvError::InvalidHashLength(0))
        );
    }

    #[test]
    fn short_and_long_digests_differ() {
        let short = BlockHash::from_slice(&[0; 16]).unwrap();
        let long = BlockHash::from_slice(&[0; 32]).unwrap();
        assert_ne!(short, long);
    }
}
