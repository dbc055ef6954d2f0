//! `kvcoord._core.UnboundedPrefixCache`: conversion only, the cache is
//! `kvcoord_core::UnboundedPrefixCache`.

use kvcoord_core::UnboundedPrefixCache;
use pyo3::prelude::*;

use crate::args::Text;
use crate::convert::extend_ids;
use crate::errors::core;
use crate::numbers::{Tokens, U32, U64};

/// The best possible prefix cache: unbounded, never evicts. Feed requests in
/// arrival order with `add`; see `kvcoord.replay.bestcase`.
#[pyclass(module = "kvcoord._core", name = "UnboundedPrefixCache")]
pub(crate) struct PyUnboundedPrefixCache {
    cache: UnboundedPrefixCache,
    tokens: Vec<u32>,
}

pymethods!(PyUnboundedPrefixCache {
    get block_size(&self) -> usize = self.cache.block_size();
    get prompt_tokens(&self) -> u64 = self.cache.prompt_tokens();
    get hit_tokens(&self) -> u64 = self.cache.hit_tokens();
}
    #[new]
    #[pyo3(signature = (block_size))]
    fn new(block_size: &Bound<'_, PyAny>) -> PyResult<Self> {
        let block_size = crate::numbers::arg::<U32>(block_size, "block_size")?.0 as usize;
        Ok(Self {
            cache: core(UnboundedPrefixCache::new(block_size))?,
            tokens: Vec::new(),
        })
    }

    /// Accounts one request (its prompt, all its output tokens and its
    /// cache salt); returns its hit in tokens.
    #[pyo3(signature = (prompt, output, salt = None))]
    fn add(
        &mut self,
        py: Python<'_>,
        prompt: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        salt: Option<Text>,
    ) -> PyResult<usize> {
        self.tokens.clear();
        extend_ids(prompt, &mut self.tokens, 0)?;
        let num_prompt = self.tokens.len();
        extend_ids(output, &mut self.tokens, num_prompt)?;
        let (cache, tokens) = (&mut self.cache, &self.tokens);
        let salt = Text::opt(salt.as_ref()).map(str::as_bytes);
        core(py.detach(|| cache.add(tokens, num_prompt, salt)))
    }

    fn __len__(&self) -> usize {
        self.cache.len()
    }
);

/// The prompt tokens of a Mooncake request (`kvcoord_core::trace_tokens`):
/// the 512-token blocks named by `hash_ids`, cut at `input_length`, as a
/// uint32 array.
#[pyfunction]
#[pyo3(signature = (hash_ids, input_length))]
pub(crate) fn mooncake_prompt_tokens<'py>(
    py: Python<'py>,
    hash_ids: &Bound<'py, PyAny>,
    input_length: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, numpy::PyArray1<u32>>> {
    let n = crate::numbers::arg::<Tokens>(input_length, "input_length")?.0;
    let not_ids = || {
        crate::errors::type_error(format!(
            "hash_ids must be a sequence of ints in [0, 2**64), got {}",
            crate::args::type_name(hash_ids)
        ))
    };
    if crate::convert::is_text(hash_ids) {
        return Err(not_ids());
    }
    let items = hash_ids.try_iter().map_err(|_| not_ids())?;
    let mut ids = Vec::new();
    crate::convert::collect_items(hash_ids, &items, &mut ids, "hash ids", |_, item| {
        crate::numbers::arg::<U64>(item, "hash id").map(|v| v.0)
    })?;
    let tokens = py.detach(|| {
        let mut out = Vec::new();
        kvcoord_core::trace_tokens::mooncake_prompt_tokens(&ids, n, &mut out).map(|()| out)
    });
    Ok(numpy::PyArray1::from_vec(py, core(tokens)?))
}
