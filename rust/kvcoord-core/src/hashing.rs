//! Block hashing: the chained per-block digests that key the prefix cache.
//!
//! Block `i` of a request (its tokens `[i*B, (i+1)*B)`, full blocks only) is
//! identified by a digest over its parent's digest, its own tokens and its
//! *extra keys* (`LoRA` adapter, multimodal items, cache salt), so two blocks
//! have equal hashes only when their whole prefixes are equal.
//!
//! # Algorithms ([`HashAlgo`])
//!
//! * `sha256_cbor` and `xxhash_cbor` are byte-identical to vLLM 0.33.0:
//!   - root: `NONE_HASH = H(cbor(seed))`, the seed as a CBOR text string;
//!   - block: `H(cbor([parent, [tok, ...], extra]))` where `parent` is a byte
//!     string (`NONE_HASH` for block 0) and `extra` is `null` or an array of
//!     keys in this order: `["lora", name, path]` (every block, when a `LoRA`
//!     adapter is set), `["mm", identifier, offset - block_start]` for each
//!     multimodal item overlapping the block (negative when the item began in
//!     an earlier block), `["cache_salt", salt]` (block 0 only, non-empty
//!     salt only);
//!   - `cbor` is canonical CBOR ([`crate::cbor`]); `H` is SHA-256 (32 bytes)
//!     or XXH3-128 (16 bytes, the 128-bit value in big-endian byte order).
//! * `xxh3_native` is kvcoord's own format, for deployments that do not need
//!   to interoperate with vLLM. It skips CBOR and hashes raw little-endian
//!   integers, which is several times faster. **Format version 1, stable:**
//!   changing it would silently invalidate every stored prefix, so the unit
//!   tests pin digests and any change must get a new algorithm name.
//!   - root: `XXH3-128("kvcoord/xxh3_native/v1/root\0" ‖ seed as UTF-8)`;
//!   - block: `XXH3-128(parent ‖ u32le(n) ‖ tok_0 … tok_{n-1} as u32le ‖ keys)`
//!     where `parent` is the 16-byte parent digest and `keys` is the
//!     concatenation, in the same order as above, of
//!     `0x01 ‖ str(name) ‖ str(path)` (`LoRA`),
//!     `0x02 ‖ str(identifier) ‖ i64le(offset - block_start)` (multimodal item),
//!     `0x03 ‖ str(salt)` (cache salt), with `str(s) = u64le(len(s)) ‖ s`
//!     (UTF-8). Each key is self-delimiting, so no two inputs share an
//!     encoding. Digests are the 128-bit value in big-endian byte order.
//!
//! * `supplied`: kvcoord computes nothing; the caller supplies each full
//!   block's digest ([`RequestHasher::supply`]), for example the digests a
//!   scheduler already computed with a hash kvcoord does not implement (a
//!   pickle-based one, or one that folds look-ahead tokens into a block). The
//!   digests are taken as they are (16 or 32 bytes, one length per request);
//!   a request may hold fewer of them than it has full blocks, and lookups
//!   and caching stop where they end.
//!
//! # Seeds
//!
//! The root digest `NONE_HASH` comes from a seed string ([`none_hash`]). When
//! the caller gives none ([`default_seed`]): `sha256_cbor` uses vLLM's fixed
//! `"vllm-none-hash"` so that digests match an unmodified vLLM engine; the
//! non-cryptographic algorithms (`xxhash_cbor`, `xxh3_native`) use a random
//! seed drawn once per process. XXH3 is not collision resistant: with a
//! known seed an attacker can precompute token sequences whose block hashes
//! collide with another tenant's prefix and so read or poison cached KV
//! blocks. A secret per-process seed makes that precomputation impossible;
//! pass an explicit seed only when several processes must agree on digests
//! (and then keep it secret).
//!
//! # Incremental hashing
//!
//! [`RequestHasher`] keeps the digests of a request's full blocks and, when
//! tokens are appended, hashes only the blocks completed since the last call.
//! Earlier digests are never recomputed.

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use sha2::{Digest, Sha256};
use xxhash_rust::xxh3::{xxh3_128, Xxh3};

pub use crate::block_hash::to_hex;
use crate::block_hash::BlockHash;
use crate::cbor::CborBuf;
use crate::error::{KvError, KvResult};

/// vLLM's default seed for `sha256_cbor` (and plain `sha256`).
pub const VLLM_DEFAULT_SEED: &str = "vllm-none-hash";

/// Domain-separation prefix of the native root digest (format version 1).
const NATIVE_ROOT_PREFIX: &[u8] = b"kvcoord/xxh3_native/v1/root\0";

/// The block-hash algorithm, selected by name.
#[derive(Debug, Copy, Clone, PartialEq, Eq, Hash)]
pub enum HashAlgo {
    /// SHA-256 over canonical CBOR; vLLM's `sha256_cbor` (32-byte digests).
    Sha256Cbor,
    /// XXH3-128 over canonical CBOR; vLLM's `xxhash_cbor` (16-byte digests).
    XxhashCbor,
    /// XXH3-128 over raw little-endian integers; kvcoord's own stable format
    /// (16-byte digests), not compatible with vLLM.
    Native,
    /// No hashing: the caller supplies every digest (16 or 32 bytes).
    Supplied,
}

impl HashAlgo {
    /// Every algorithm, in the order of [`HashAlgo::NAMES`].
    pub const ALL: [Self; 4] = [
        Self::Sha256Cbor,
        Self::XxhashCbor,
        Self::Native,
        Self::Supplied,
    ];
    /// The algorithms that compute digests (every one but `supplied`).
    pub const COMPUTED: [Self; 3] = [Self::Sha256Cbor, Self::XxhashCbor, Self::Native];
    /// The accepted names.
    pub const NAMES: [&'static str; 4] = ["sha256_cbor", "xxhash_cbor", "xxh3_native", "supplied"];

    /// Parse an algorithm name (exact, lower case).
    pub fn from_name(name: &str) -> KvResult<Self> {
        Self::NAMES
            .iter()
            .position(|n| *n == name)
            .map(|i| Self::ALL[i])
            .ok_or_else(|| KvError::InvalidConfig {
                name: "hash_algo",
                value: format!("{name:?}"),
                rule: format!(
                    "unknown hash algorithm; expected one of {}",
                    Self::NAMES.join(", ")
                ),
            })
    }

    /// The algorithm's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sha256Cbor => Self::NAMES[0],
            Self::XxhashCbor => Self::NAMES[1],
            Self::Native => Self::NAMES[2],
            Self::Supplied => Self::NAMES[3],
        }
    }

    /// Digest length in bytes (32 for SHA-256, 16 for XXH3-128); `None` for
    /// supplied digests, whose length the caller chooses.
    pub fn digest_len(self) -> Option<usize> {
        match self {
            Self::Sha256Cbor => Some(32),
            Self::XxhashCbor | Self::Native => Some(16),
            Self::Supplied => None,
        }
    }

    /// Whether kvcoord computes the digests (every algorithm but `supplied`).
    pub fn computes(self) -> bool {
        !matches!(self, Self::Supplied)
    }

    /// `self` when it computes digests; for `supplied`, the error a caller
    /// asking kvcoord to compute a digest (`what`) gets.
    pub fn computing(self, what: &str) -> KvResult<Self> {
        if self.computes() {
            return Ok(self);
        }
        Err(KvError::InvalidConfig {
            name: "hash_algo",
            value: format!("{:?}", self.name()),
            rule: format!(
                "{what} needs an algorithm that computes digests; \"supplied\" digests come from the caller"
            ),
        })
    }

    /// Whether digests are byte-identical to vLLM 0.33.0's algorithm of the
    /// same name.
    pub fn is_vllm_compatible(self) -> bool {
        matches!(self, Self::Sha256Cbor | Self::XxhashCbor)
    }

    /// Whether the default seed is random per process (see the module docs).
    pub fn uses_random_default_seed(self) -> bool {
        !matches!(self, Self::Sha256Cbor)
    }
}

impl FromStr for HashAlgo {
    type Err = KvError;
    fn from_str(s: &str) -> KvResult<Self> {
        Self::from_name(s)
    }
}

impl fmt::Display for HashAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The random seed of this process: 32 bytes from the OS, as 64 hex digits
/// (the same shape as vLLM's random seed), drawn on first use and then fixed
/// for the life of the process so that all requests agree on `NONE_HASH`.
///
/// # Panics
/// When the operating system cannot supply random bytes (no safe fallback
/// exists: a guessable seed is what this seed prevents).
pub fn process_random_seed() -> &'static str {
    static SEED: OnceLock<String> = OnceLock::new();
    SEED.get_or_init(|| {
        let mut raw = [0u8; 32];
        getrandom::fill(&mut raw).expect("the OS random number generator is unavailable");
        to_hex(&raw)
    })
}

/// The seed used when the caller gives none: `"vllm-none-hash"` for
/// `sha256_cbor`, [`process_random_seed`] otherwise.
pub fn default_seed(algo: HashAlgo) -> &'static str {
    if algo.uses_random_default_seed() {
        process_random_seed()
    } else {
        VLLM_DEFAULT_SEED
    }
}

#[inline]
fn xxh3_digest(v: u128) -> BlockHash {
    BlockHash::from_slice(&v.to_be_bytes()).expect("16-byte digest")
}

/// SHA-256 initial state (FIPS 180-4, 5.3.3).
const SHA256_H0: [u32; 8] = [
    0x6a09_e667,
    0xbb67_ae85,
    0x3c6e_f372,
    0xa54f_f53a,
    0x510e_527f,
    0x9b05_688c,
    0x1f83_d9ab,
    0x5be0_cd19,
];

/// SHA-256 of `msg`. A block payload (about 90 bytes: parent digest, 16
/// token ids, no extra keys) is padded in a stack buffer and compressed in
/// one call (two blocks, with the CPU's SHA extensions where it has them,
/// as `sha2` detects at run time); this skips the streaming hasher's
/// buffering, a large share of the work at this size. Longer payloads
/// (long `LoRA` names, many multimodal items) take the streaming hasher.
#[inline]
fn sha256(msg: &[u8]) -> [u8; 32] {
    const MAX_BLOCKS: usize = 4;
    let n = msg.len();
    // The message, one 0x80 byte and the 64-bit bit length.
    let blocks = (n + 9).div_ceil(64);
    if blocks > MAX_BLOCKS {
        return Sha256::digest(msg).into();
    }
    let mut buf = [[0u8; 64]; MAX_BLOCKS];
    let flat = buf.as_flattened_mut();
    flat[..n].copy_from_slice(msg);
    flat[n] = 0x80;
    let end = blocks * 64;
    flat[end - 8..end].copy_from_slice(&((n as u64) * 8).to_be_bytes());
    let mut state = SHA256_H0;
    sha2::block_api::compress256(&mut state, &buf[..blocks]);
    let mut out = [0u8; 32];
    for (dst, word) in out.chunks_exact_mut(4).zip(state) {
        dst.copy_from_slice(&word.to_be_bytes());
    }
    out
}

#[inline]
fn digest(algo: HashAlgo, payload: &[u8]) -> BlockHash {
    match algo {
        HashAlgo::Sha256Cbor => BlockHash::from_slice(&sha256(payload)).expect("32-byte digest"),
        // A supplied request's root (see `none_hash`) is the only payload
        // hashed for it; it is never a block's parent.
        HashAlgo::XxhashCbor | HashAlgo::Native | HashAlgo::Supplied => {
            xxh3_digest(xxh3_128(payload))
        }
    }
}

/// Whether a request holding `num_hashes` block hashes of `block_size`
/// tokens each has a full block left to hash at `num_tokens` tokens: a
/// request block hasher called on every token append has nothing to do
/// until then.
pub fn completes_block(num_hashes: usize, block_size: usize, num_tokens: usize) -> bool {
    num_hashes.saturating_add(1).saturating_mul(block_size) <= num_tokens
}

/// The root digest (`NONE_HASH`) for `seed`; the parent of block 0.
pub fn none_hash(algo: HashAlgo, seed: &str) -> BlockHash {
    match algo {
        HashAlgo::Sha256Cbor | HashAlgo::XxhashCbor => {
            let mut c = CborBuf::with_capacity(seed.len() + 9);
            c.text(seed);
            digest(algo, c.as_bytes())
        }
        HashAlgo::Native | HashAlgo::Supplied => {
            let mut h = Xxh3::new();
            h.update(NATIVE_ROOT_PREFIX);
            h.update(seed.as_bytes());
            xxh3_digest(h.digest128())
        }
    }
}

/// Check one token id: it must be non-negative and fit in 32 bits.
/// `position` is its index in the sequence being validated (for the error).
#[inline]
pub fn token_id(position: usize, value: i64) -> KvResult<u32> {
    u32::try_from(value).map_err(|_| KvError::InvalidTokenId {
        position,
        value: i128::from(value),
    })
}

/// A `LoRA` adapter: name and path, both part of every block's extra keys.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LoraKey {
    /// Adapter name.
    pub name: String,
    /// Adapter path.
    pub path: String,
}

/// A multimodal item placed in the prompt: an identifier (the content hash
/// the engine computed) and its token range `[offset, offset + length)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MmFeature {
    /// Content identifier, hashed as a text string.
    pub identifier: String,
    /// First prompt position of the item.
    pub offset: u32,
    /// Number of prompt positions the item occupies.
    pub length: u32,
}

impl MmFeature {
    fn end(&self) -> u64 {
        u64::from(self.offset) + u64::from(self.length)
    }
}

/// The per-request inputs besides tokens that enter block hashes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ExtraKeys {
    /// `LoRA` adapter (every block).
    pub lora: Option<LoraKey>,
    /// Multimodal items, sorted by offset (see [`ExtraKeys::new`]).
    pub mm_features: Vec<MmFeature>,
    /// Cache salt (block 0 only; an empty salt counts as none, as in vLLM).
    pub cache_salt: Option<String>,
}

impl ExtraKeys {
    /// Build the extra keys; multimodal items are sorted by offset (stable),
    /// the order vLLM assumes.
    pub fn new(
        lora: Option<LoraKey>,
        mut mm_features: Vec<MmFeature>,
        cache_salt: Option<String>,
    ) -> Self {
        mm_features.sort_by_key(|f| f.offset);
        Self {
            lora,
            mm_features,
            cache_salt,
        }
    }

    /// Whether no extra key can ever apply (every block's `extra` is null).
    pub fn is_empty(&self) -> bool {
        self.lora.is_none() && self.mm_features.is_empty() && self.salt().is_none()
    }

    fn salt(&self) -> Option<&str> {
        self.cache_salt.as_deref().filter(|s| !s.is_empty())
    }
}

/// Algorithm, block size and root digest: everything needed to hash blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashConfig {
    algo: HashAlgo,
    block_size: usize,
    none_hash: BlockHash,
}

impl HashConfig {
    /// A configuration; `seed` defaults to [`default_seed`].
    pub fn new(algo: HashAlgo, block_size: usize, seed: Option<&str>) -> KvResult<Self> {
        if block_size == 0 {
            return Err(KvError::InvalidConfig {
                name: "hash_block_size",
                value: "0".into(),
                rule: "must be a positive number of tokens".into(),
            });
        }
        if u32::try_from(block_size).is_err() {
            return Err(KvError::InvalidConfig {
                name: "hash_block_size",
                value: block_size.to_string(),
                rule: "must be below 2^32".into(),
            });
        }
        let seed = seed.unwrap_or_else(|| default_seed(algo));
        Ok(Self {
            algo,
            block_size,
            none_hash: none_hash(algo, seed),
        })
    }

    /// The algorithm.
    pub fn algo(&self) -> HashAlgo {
        self.algo
    }

    /// Tokens per hashed block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The root digest (parent of block 0).
    pub fn none_hash(&self) -> BlockHash {
        self.none_hash
    }
}

/// Incremental hasher of one request's full blocks.
///
/// Feed it the request's whole token sequence (prompt then outputs) after
/// each change with [`RequestHasher::update`]; it hashes the blocks completed
/// since the last call, chaining from the last stored digest.
#[derive(Debug, Clone)]
pub struct RequestHasher {
    config: HashConfig,
    extra: ExtraKeys,
    hashes: Vec<BlockHash>,
    /// Index of the first multimodal item that a later block may overlap
    /// (vLLM's resume index, carried between blocks).
    mm_next: usize,
    /// Reused payload buffer.
    buf: CborBuf,
    /// Reused list of `(item index, offset relative to block start)`.
    mm_scratch: Vec<(usize, i64)>,
}

impl RequestHasher {
    /// A hasher with no blocks hashed yet.
    pub fn new(config: HashConfig, extra: ExtraKeys) -> Self {
        Self {
            config,
            extra,
            hashes: Vec::new(),
            mm_next: 0,
            buf: CborBuf::with_capacity(256),
            mm_scratch: Vec::new(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &HashConfig {
        &self.config
    }

    /// The extra keys.
    pub fn extra_keys(&self) -> &ExtraKeys {
        &self.extra
    }

    /// Digests of the full blocks hashed so far, block 0 first.
    #[inline]
    pub fn block_hashes(&self) -> &[BlockHash] {
        &self.hashes
    }

    /// Number of tokens covered by the stored digests.
    pub fn num_hashed_tokens(&self) -> usize {
        self.hashes.len() * self.config.block_size
    }

    /// Number of new full blocks that [`RequestHasher::update`] would hash
    /// for a sequence of `num_tokens` tokens.
    pub fn pending_blocks(&self, num_tokens: usize) -> usize {
        if !self.config.algo.computes() {
            return 0;
        }
        (num_tokens / self.config.block_size).saturating_sub(self.hashes.len())
    }

    /// Number of tokens [`RequestHasher::update`] would hash for a
    /// sequence of `num_tokens` tokens (a caller releases its locks for a
    /// long one).
    pub fn num_tokens_to_hash(&self, num_tokens: usize) -> usize {
        self.pending_blocks(num_tokens) * self.config.block_size
    }

    /// Digest length of this request's hashes: the algorithm's, or for
    /// supplied digests the length of the first one (32 before any).
    pub fn digest_len(&self) -> usize {
        self.config
            .algo
            .digest_len()
            .or_else(|| self.hashes.first().map(BlockHash::len))
            .unwrap_or(crate::block_hash::MAX_DIGEST_LEN)
    }

    /// Append caller-supplied digests (algorithm `supplied` only) for the
    /// next full blocks of a `num_tokens`-token sequence. All-or-nothing:
    /// on error nothing is appended.
    ///
    /// # Errors
    /// [`KvError::InvalidConfig`] when this hasher computes its digests;
    /// [`KvError::InvalidArgument`] when a digest's length differs from the
    /// request's earlier ones, or when the digests would outnumber the full
    /// blocks of `num_tokens` tokens.
    pub fn supply(&mut self, digests: &[BlockHash], num_tokens: usize) -> KvResult<()> {
        if self.config.algo.computes() {
            return Err(KvError::InvalidConfig {
                name: "hash_algo",
                value: format!("{:?}", self.config.algo.name()),
                rule: "only a request with hash_algo=\"supplied\" takes supplied block hashes"
                    .into(),
            });
        }
        let len = self.hashes.first().or(digests.first()).map(BlockHash::len);
        if let Some(bad) = digests.iter().position(|d| Some(d.len()) != len) {
            return Err(KvError::InvalidArgument {
                name: "block_hashes",
                detail: format!(
                    "digest {bad} has {} bytes; this request's digests have {} bytes",
                    digests[bad].len(),
                    len.unwrap_or_default()
                ),
            });
        }
        let full = num_tokens / self.config.block_size;
        if self.hashes.len() + digests.len() > full {
            return Err(KvError::InvalidArgument {
                name: "block_hashes",
                detail: format!(
                    "{} digests held plus {} supplied exceed the {full} full blocks of {num_tokens} tokens",
                    self.hashes.len(),
                    digests.len()
                ),
            });
        }
        crate::limits::try_reserve(&mut self.hashes, digests.len(), "block hashes")?;
        self.hashes.extend_from_slice(digests);
        Ok(())
    }

    /// Reserve room for the digests of a `num_tokens`-token sequence, so
    /// that the next [`update`](Self::update) allocates nothing; a refused
    /// allocation is [`KvError::OutOfMemory`].
    pub fn try_reserve_for(&mut self, num_tokens: usize) -> crate::KvResult<()> {
        let n = self.pending_blocks(num_tokens);
        crate::limits::try_reserve(&mut self.hashes, n, "block hashes")
    }

    /// Hash every full block of `tokens` not hashed yet and return how many
    /// digests were appended. `tokens` is the request's whole sequence; its
    /// already-hashed prefix must be unchanged since the previous call (it is
    /// not re-read).
    pub fn update(&mut self, tokens: &[u32]) -> usize {
        let bs = self.config.block_size;
        let n_new = self.pending_blocks(tokens.len());
        self.hashes.reserve(n_new);
        for _ in 0..n_new {
            let start = self.hashes.len() * bs;
            let parent = self.hashes.last().copied().unwrap_or(self.config.none_hash);
            let h = self.hash_block(&parent, start, &tokens[start..start + bs]);
            self.hashes.push(h);
        }
        n_new
    }

    /// Fill `mm_scratch` with the multimodal items overlapping
    /// `[start, end)`, advancing the resume index exactly as vLLM does: an
    /// item is skipped once a block starts past its end, and the scan stops
    /// at the first item that starts at or after `end` or extends past it.
    fn scan_mm(&mut self, start: u64, end: u64) {
        self.mm_scratch.clear();
        let items = &self.extra.mm_features;
        let Some(last) = items.last() else { return };
        if last.end() < start {
            return;
        }
        let mut i = self.mm_next;
        while let Some(f) = items.get(i) {
            if end <= u64::from(f.offset) {
                break;
            }
            if start > f.end() {
                i += 1;
                continue;
            }
            let start = i64::try_from(start).expect("token positions fit in i64");
            self.mm_scratch.push((i, i64::from(f.offset) - start));
            if end >= f.end() {
                i += 1;
            } else {
                break;
            }
        }
        self.mm_next = i;
    }

    fn hash_block(&mut self, parent: &BlockHash, start: usize, tokens: &[u32]) -> BlockHash {
        self.scan_mm(start as u64, (start + tokens.len()) as u64);
        let salt = if start == 0 { self.extra.salt() } else { None };
        let n_keys = usize::from(self.extra.lora.is_some())
            + self.mm_scratch.len()
            + usize::from(salt.is_some());
        let algo = self.config.algo;
        let c = &mut self.buf;
        c.clear();
        match algo {
            HashAlgo::Supplied => unreachable!("update() hashes nothing for supplied digests"),
            HashAlgo::Sha256Cbor | HashAlgo::XxhashCbor => {
                c.array(3);
                c.bytes(parent.as_bytes());
                c.u32_array(tokens);
                if n_keys == 0 {
                    c.null();
                } else {
                    c.array(n_keys);
                    if let Some(l) = &self.extra.lora {
                        c.array(3);
                        c.text("lora");
                        c.text(&l.name);
                        c.text(&l.path);
                    }
                    for &(i, rel) in &self.mm_scratch {
                        c.array(3);
                        c.text("mm");
                        c.text(&self.extra.mm_features[i].identifier);
                        c.int(rel);
                    }
                    if let Some(s) = salt {
                        c.array(2);
                        c.text("cache_salt");
                        c.text(s);
                    }
                }
                digest(algo, c.as_bytes())
            }
            HashAlgo::Native => {
                let mut raw = NativeWriter(c);
                raw.bytes(parent.as_bytes());
                raw.u32(tokens.len() as u32);
                raw.u32s(tokens);
                if let Some(l) = &self.extra.lora {
                    raw.tag(1);
                    raw.str(&l.name);
                    raw.str(&l.path);
                }
                for &(i, rel) in &self.mm_scratch {
                    raw.tag(2);
                    raw.str(&self.extra.mm_features[i].identifier);
                    raw.bytes(&rel.to_le_bytes());
                }
                if let Some(s) = salt {
                    raw.tag(3);
                    raw.str(s);
                }
                digest(algo, c.as_bytes())
            }
        }
    }
}

/// Raw little-endian writer for the native format, sharing the CBOR buffer's
/// allocation.
struct NativeWriter<'a>(&'a mut CborBuf);

impl NativeWriter<'_> {
    #[inline]
    fn bytes(&mut self, b: &[u8]) {
        self.0.raw(b);
    }
    #[inline]
    fn tag(&mut self, t: u8) {
        self.0.raw(&[t]);
    }
    #[inline]
    fn u32(&mut self, v: u32) {
        self.0.raw(&v.to_le_bytes());
    }
    #[inline]
    fn u32s(&mut self, vs: &[u32]) {
        self.0.raw_u32_le(vs);
    }
    #[inline]
    fn str(&mut self, s: &str) {
        self.0.raw(&(s.len() as u64).to_le_bytes());
        self.0.raw(s.as_bytes());
    }
}

/// A multimodal item from unchecked integers: offset and length must be
/// non-negative and fit in 32 bits (they are prompt positions).
pub fn mm_feature(identifier: String, offset: i64, length: i64) -> KvResult<MmFeature> {
    match (u32::try_from(offset), u32::try_from(length)) {
        (Ok(offset), Ok(length)) => Ok(MmFeature {
            identifier,
            offset,
            length,
        }),
        _ => Err(KvError::InvalidArgument {
            name: "mm_features",
            detail: format!(
                "item {identifier:?} has offset {offset} and length {length}; \
                 both must be in [0, 2^32) (prompt token positions)"
            ),
        }),
    }
}

/// Hash all full blocks of `tokens` at once (convenience for tests and
/// one-off use; the result equals incremental hashing).
pub fn compute_block_hashes(
    config: HashConfig,
    extra: ExtraKeys,
    tokens: &[u32],
) -> Vec<BlockHash> {
    let mut h = RequestHasher::new(config, extra);
    h.update(tokens);
    h.hashes
}

#[cfg(test)]
mod tests;
