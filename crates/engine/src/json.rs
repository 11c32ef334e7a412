//! Parsing JSON without holding up the async workers: a large input (a 3 MiB request
//! body, a tool call of 1 MiB coming from a helper) takes tens of milliseconds to parse
//! in a debug build, and a worker busy with it delays every other request on it, health
//! checks included.

use serde::de::DeserializeOwned;

/// Inputs at least this large are parsed on a blocking thread.
const INLINE_LIMIT: usize = 64 << 10;

/// Whether `bytes` are worth a blocking thread to parse.
pub fn is_large(bytes: &[u8]) -> bool {
    bytes.len() >= INLINE_LIMIT
}

/// Parses `bytes` as a `T`; on a blocking thread when they are large. Not cancel-safe
/// for a caller that consumed its input first: such a caller keeps the parse itself (see
/// `runner::Helper::next_event`).
pub async fn parse<T, B>(bytes: B) -> serde_json::Result<T>
where
    T: DeserializeOwned + Send + 'static,
    B: AsRef<[u8]> + Send + 'static,
{
    if !is_large(bytes.as_ref()) {
        return serde_json::from_slice(bytes.as_ref());
    }
    match tokio::task::spawn_blocking(move || serde_json::from_slice(bytes.as_ref())).await {
        Ok(parsed) => parsed,
        // The parse panicked (it does not) or the runtime is shutting down.
        Err(e) => Err(serde::de::Error::custom(format!("parsing was interrupted: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn small_and_large_inputs_parse_the_same() {
        let small: Vec<u32> = super::parse(b"[1,2,3]".to_vec()).await.unwrap();
        assert_eq!(small, [1, 2, 3]);
        let text = serde_json::to_vec(&vec![7u32; 100_000]).unwrap();
        assert!(text.len() > super::INLINE_LIMIT);
        let large: Vec<u32> = super::parse(text).await.unwrap();
        assert_eq!(large.len(), 100_000);
        assert!(super::parse::<Vec<u32>, _>(b"[1,".to_vec()).await.is_err());
    }
}
