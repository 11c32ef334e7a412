//! Ids clients see: 21 characters over `[A-Za-z0-9_-]` (126 random bits).

use rand::Rng;

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-";

pub fn new_id() -> String {
    let mut rng = rand::rng();
    (0..21).map(|_| ALPHABET[rng.random_range(0..64)] as char).collect()
}

/// Whether `s` has the shape of an id (callers use it before touching storage).
pub fn is_id(s: &str) -> bool {
    s.len() == 21 && s.bytes().all(|b| ALPHABET.contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_have_the_nanoid_shape_and_differ() {
        let a = new_id();
        assert!(is_id(&a), "{a}");
        assert_ne!(a, new_id());
        assert!(!is_id("../../etc/passwd"));
    }
}
