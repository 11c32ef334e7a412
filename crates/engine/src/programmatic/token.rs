//! Continuation tokens: `base64url(session_id "." pause) "." base64url(HMAC-SHA256)`.
//! A token names one session and one pause; the session decides whether that pause is
//! still open (single use). Forging or altering one breaks the signature.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

type HmacSha256 = Hmac<Sha256>;

/// Why the token key could not be loaded or created.
#[derive(Debug, thiserror::Error)]
pub enum TokenKeyError {
    #[error("create {}: {source}", path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the token key must be 64 hex characters")]
    Length,
    #[error("the token key is not hex")]
    NotHex,
}

#[derive(Clone)]
pub struct TokenKey([u8; 32]);

impl TokenKey {
    /// The configured secret, or the one in `<data_dir>/token.key`, created on first use.
    pub fn load(configured: Option<&str>, data_dir: &Path) -> Result<TokenKey, TokenKeyError> {
        let hex = match configured {
            Some(hex) => hex.to_owned(),
            None => {
                let path = data_dir.join("token.key");
                match std::fs::read_to_string(&path) {
                    Ok(text) => text.trim().to_owned(),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        let key: [u8; 32] = rand::random();
                        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
                        let mut file = match std::fs::OpenOptions::new()
                            .write(true)
                            .create_new(true)
                            .mode(0o600)
                            .open(&path)
                        {
                            Ok(file) => file,
                            Err(source) => return Err(TokenKeyError::Create { path, source }),
                        };
                        if let Err(source) = file.write_all(hex.as_bytes()) {
                            return Err(TokenKeyError::Write { path, source });
                        }
                        hex
                    }
                    Err(source) => return Err(TokenKeyError::Read { path, source }),
                }
            }
        };
        let mut key = [0u8; 32];
        if hex.len() != 64 {
            return Err(TokenKeyError::Length);
        }
        for (i, byte) in key.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| TokenKeyError::NotHex)?;
        }
        Ok(TokenKey(key))
    }

    fn mac(&self, payload: &[u8]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
        mac.update(payload);
        mac
    }

    pub fn sign(&self, session_id: &str, pause: u64) -> String {
        let payload = format!("{session_id}.{pause}");
        let tag = self.mac(payload.as_bytes()).finalize().into_bytes();
        format!("{}.{}", URL_SAFE_NO_PAD.encode(payload), URL_SAFE_NO_PAD.encode(tag))
    }

    /// The session and pause a genuine token names; None for anything else.
    pub fn verify(&self, token: &str) -> Option<(String, u64)> {
        let (payload, tag) = token.split_once('.')?;
        let payload = URL_SAFE_NO_PAD.decode(payload).ok()?;
        let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
        self.mac(&payload).verify_slice(&tag).ok()?;
        let payload = String::from_utf8(payload).ok()?;
        let (session, pause) = payload.rsplit_once('.')?;
        Some((session.to_owned(), pause.parse().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> TokenKey {
        TokenKey([7u8; 32])
    }

    #[test]
    fn signed_tokens_verify_and_name_their_pause() {
        let t = key().sign("abcdefghijklmnopqrstu", 3);
        assert_eq!(key().verify(&t), Some(("abcdefghijklmnopqrstu".into(), 3)));
    }

    #[test]
    fn any_altered_character_breaks_the_token() {
        let t = key().sign("abcdefghijklmnopqrstu", 1);
        for i in 0..t.len() {
            let mut bytes = t.clone().into_bytes();
            bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
            let altered = String::from_utf8(bytes).unwrap();
            if altered != t {
                assert_eq!(key().verify(&altered), None, "altered at {i}");
            }
        }
        assert_eq!(TokenKey([8u8; 32]).verify(&t), None, "another server's key");
    }

    #[test]
    fn the_key_is_created_once_and_kept() {
        let dir = std::env::temp_dir().join(format!("sandcall-token-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = TokenKey::load(None, &dir).unwrap();
        let b = TokenKey::load(None, &dir).unwrap();
        assert_eq!(a.0, b.0);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(dir.join("token.key")).unwrap().permissions().mode() & 0o777,
            0o600
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
