//! The API-key provider: static keys, each naming a principal, kept only as SHA-256
//! hashes (`[[api_keys]]` in the config, or SANDCALL_API_KEYS).

use super::Principal;
use sandcall_config::{key_hash, Config};
use std::collections::HashMap;

#[derive(Clone, Default)]
pub struct ApiKeys {
    /// Hex SHA-256 of a key -> principal.
    by_hash: HashMap<String, String>,
}

impl ApiKeys {
    pub fn new(config: &Config) -> Self {
        ApiKeys {
            by_hash: config
                .auth
                .api_keys
                .iter()
                .map(|k| (k.sha256.to_ascii_lowercase(), k.principal.clone()))
                .collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }

    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    /// The principal of `key`, if it is a configured key.
    pub fn principal(&self, key: &str) -> Option<Principal> {
        self.by_hash.get(&key_hash(key)).map(|p| Principal(p.clone()))
    }
}
