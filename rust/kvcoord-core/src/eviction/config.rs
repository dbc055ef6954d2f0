//! [`EvictionConfig`]: the built-in policies by name, as the spec strings
//! callers write (`lfu:half_life=64`), parsed and printed in one place.
//!
//! Invariant: a config that parses or passes [`EvictionConfig::validate`]
//! builds a policy (the pool builds it, `super::Ranker`), and prints back
//! as a spec string that parses to itself.

use std::fmt;
use std::str::FromStr;

use crate::error::KvError;

/// The built-in eviction policies, chosen when the pool is built.
///
/// Parsed from and printed as a spec string: `lru`, `lfu`,
/// `lfu:half_life=N`, `prefix-depth`, `prefix-depth:half_life=N`,
/// `priority`, `priority:retention=N`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum EvictionConfig {
    /// vLLM 0.33.0's order (the default).
    #[default]
    Lru,
    /// Least frequently used with aging; see [`Lfu`](super::Lfu).
    Lfu {
        /// Blocks handed out between two halvings of every frequency; 0
        /// means one pool turnover (the number of usable blocks).
        half_life: u32,
    },
    /// Shallow prefix blocks protected; see [`PrefixDepth`](super::PrefixDepth).
    PrefixDepth {
        /// Blocks handed out between two one-level decays of protection; 0
        /// means one pool turnover.
        half_life: u32,
    },
    /// Per-request priority with a retention duration; see [`Priority`](super::Priority).
    Priority {
        /// Clock ticks a released block keeps its priority.
        retention: u32,
    },
}

impl EvictionConfig {
    /// Default retention of [`EvictionConfig::Priority`], in clock ticks.
    pub const DEFAULT_RETENTION: u32 = 1000;

    /// The built-in policies' names (what a spec starts with), in the order the
    /// docs list them; exported to Python for its did-you-mean.
    pub const NAMES: [&'static str; 4] = ["lru", "lfu", "prefix-depth", "priority"];

    /// Check the parameters' ranges.
    pub fn validate(&self) -> Result<(), KvError> {
        match *self {
            Self::Priority { retention } if retention > i32::MAX as u32 => {
                Err(KvError::InvalidConfig {
                    name: "eviction_policy",
                    value: self.to_string(),
                    rule: format!("retention must be at most {}", i32::MAX),
                })
            }
            _ => Ok(()),
        }
    }
}

impl fmt::Display for EvictionConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Lru => f.write_str("lru"),
            Self::Lfu { half_life: 0 } => f.write_str("lfu"),
            Self::Lfu { half_life } => write!(f, "lfu:half_life={half_life}"),
            Self::PrefixDepth { half_life: 0 } => f.write_str("prefix-depth"),
            Self::PrefixDepth { half_life } => write!(f, "prefix-depth:half_life={half_life}"),
            Self::Priority { retention } => write!(f, "priority:retention={retention}"),
        }
    }
}

impl FromStr for EvictionConfig {
    type Err = KvError;

    fn from_str(spec: &str) -> Result<Self, KvError> {
        let fail = |rule: String| KvError::InvalidConfig {
            name: "eviction_policy",
            value: format!("{spec:?}"),
            rule,
        };
        let (name, params) = match spec.split_once(':') {
            Some((name, params)) => (name, Some(params)),
            None => (spec, None),
        };
        // The one parameter each policy takes, and its value when omitted.
        let (param, default) = match name {
            "lru" => ("", 0),
            "lfu" | "prefix-depth" => ("half_life", 0),
            "priority" => ("retention", Self::DEFAULT_RETENTION),
            _ => {
                return Err(fail(format!(
                    "must be one of {} (optionally followed by :half_life=N or :retention=N)",
                    Self::NAMES.join(", ")
                )))
            }
        };
        let value = match params {
            None => default,
            Some(p) => {
                let (key, value) = p.split_once('=').unwrap_or((p, ""));
                if param.is_empty() || key != param {
                    return Err(fail(if param.is_empty() {
                        format!("{name} takes no parameter")
                    } else {
                        format!("{name} takes one parameter, {param}=N")
                    }));
                }
                value
                    .parse::<u32>()
                    .map_err(|_| fail(format!("{param} must be a non-negative 32-bit integer")))?
            }
        };
        let config = match name {
            "lru" => Self::Lru,
            "lfu" => Self::Lfu { half_life: value },
            "prefix-depth" => Self::PrefixDepth { half_life: value },
            _ => Self::Priority { retention: value },
        };
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_strings_round_trip() {
        for (spec, want) in [
            ("lru", EvictionConfig::Lru),
            ("lfu", EvictionConfig::Lfu { half_life: 0 }),
            ("lfu:half_life=64", EvictionConfig::Lfu { half_life: 64 }),
            ("prefix-depth", EvictionConfig::PrefixDepth { half_life: 0 }),
            (
                "prefix-depth:half_life=9",
                EvictionConfig::PrefixDepth { half_life: 9 },
            ),
            (
                "priority:retention=5",
                EvictionConfig::Priority { retention: 5 },
            ),
        ] {
            let parsed: EvictionConfig = spec.parse().unwrap();
            assert_eq!(parsed, want, "{spec}");
            assert_eq!(parsed.to_string(), spec);
        }
        for name in EvictionConfig::NAMES {
            let parsed: EvictionConfig = name.parse().unwrap();
            assert!(parsed.to_string().starts_with(name), "{name}");
        }
        assert_eq!(
            "priority".parse::<EvictionConfig>().unwrap(),
            EvictionConfig::Priority {
                retention: EvictionConfig::DEFAULT_RETENTION
            }
        );
        for bad in [
            "",
            "LRU",
            "lru:x=1",
            "lfu:half_life",
            "lfu:half_life=-1",
            "lfu:retention=3",
            "priority:retention=4294967295",
            "arc",
        ] {
            let err = bad.parse::<EvictionConfig>().unwrap_err();
            assert!(
                matches!(
                    err,
                    KvError::InvalidConfig {
                        name: "eviction_policy",
                        ..
                    }
                ),
                "{bad}: {err}"
            );
        }
    }
}
