//! What handlers read requests with: the JSON body extractor (every failure an
//! `ApiError`), the path extractor, and the body deadline every body has to arrive in.

use crate::error::ApiError;
use crate::AppState;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use hyper::body::{Frame, SizeHint};
use sandcall_api::error_type;
use serde::de::DeserializeOwned;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// A JSON body whose every failure (content type, size, syntax, types) is an ApiError.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned + Send + 'static> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let unsupported = |message: String| {
            ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                error_type::UNSUPPORTED_MEDIA_TYPE,
                message,
            )
        };
        match req.headers().get(header::CONTENT_TYPE) {
            Some(ct) => {
                let ct = ct.to_str().unwrap_or("").to_ascii_lowercase();
                let mime = ct.split(';').next().unwrap_or("").trim();
                if !(mime == "application/json" || mime.ends_with("+json")) {
                    return Err(unsupported(format!(
                        "expected Content-Type: application/json, got {mime:?}"
                    )));
                }
            }
            // A web page can send a body without a Content-Type (or with one of the
            // CORS-safelisted types, refused above) without a preflight; in local
            // mode, where no key stands in its way, a JSON body must say it is JSON.
            None if state.auth.local_mode() => {
                return Err(unsupported(
                    "expected Content-Type: application/json (required in local mode)".into(),
                ))
            }
            None => {}
        }
        // A resume carries tool results of up to max_tool_result_bytes each.
        let limit = if req.uri().path() == "/v1/exec/programmatic" {
            state.config.max_programmatic_body_bytes()
        } else {
            state.config.max_body_bytes()
        };
        let bytes = read_body(req.into_body(), limit).await?;
        sandcall_engine::json::parse(bytes).await.map(JsonBody).map_err(|e| {
            use serde_json::error::Category;
            match e.classify() {
                Category::Syntax | Category::Eof | Category::Io => ApiError::new(
                    StatusCode::BAD_REQUEST,
                    error_type::INVALID_JSON,
                    format!("malformed JSON: {e}"),
                ),
                Category::Data => ApiError::bad_request(format!("invalid request: {e}")),
            }
        })
    }
}

/// How long the rest of a refused body is read and thrown away before the answer.
pub const DRAIN_FOR: std::time::Duration = std::time::Duration::from_secs(5);

/// The whole body, at most `limit` bytes. A longer one is refused with 413, but read on
/// and thrown away first (for at most `DRAIN_FOR`): a client that sends its whole body
/// before it reads the answer, as most do, then gets the 413 rather than a connection
/// reset by the bytes the server never read.
async fn read_body(body: axum::body::Body, limit: usize) -> Result<axum::body::Bytes, ApiError> {
    use http_body_util::BodyExt;
    let mut body = body;
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            if body_timed_out(&e) {
                request_timeout()
            } else {
                ApiError::bad_request(format!("could not read the request body: {e}"))
            }
        })?;
        let Some(data) = frame.data_ref() else { continue };
        if bytes.len() + data.len() > limit {
            let drain = async { while let Some(Ok(_)) = body.frame().await {} };
            let _ = tokio::time::timeout(DRAIN_FOR, drain).await;
            return Err(ApiError::too_large(format!(
                "the request body is larger than the server accepts ({limit} bytes)"
            )));
        }
        bytes.extend_from_slice(data);
    }
    Ok(bytes.into())
}

/// The error a request body gives when it has not arrived whole by its deadline.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within body_read_timeout_ms")]
pub struct BodyTimeout;

/// Whether `error`, or an error it wraps, is a `BodyTimeout`. Body readers wrap the
/// body's errors in their own (multipart does, twice).
pub(crate) fn body_timed_out(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if e.is::<BodyTimeout>() {
            return true;
        }
        next = e.source();
    }
    false
}

/// 408: the body did not arrive in time.
pub(crate) fn request_timeout() -> ApiError {
    ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        error_type::REQUEST_TIMEOUT,
        "the request body did not arrive in time (body_read_timeout_ms)",
    )
}

/// Middleware: every request's body must arrive whole within `body_read_timeout_ms` of
/// its headers, or reading it fails with `BodyTimeout` (answered 408 by the reader). A
/// client that sends half a body and stalls would otherwise hold its handler, and the
/// connection, for as long as it likes.
pub async fn body_deadline(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let body = if body.is_end_stream() {
        body
    } else {
        Body::new(DeadlineBody {
            body,
            deadline: tokio::time::Instant::now() + Duration::from_millis(state.config.listen.body_read_timeout_ms),
            timer: None,
        })
    };
    let mut response = next.run(Request::from_parts(parts, body)).await;
    if response.status() == StatusCode::REQUEST_TIMEOUT {
        // The rest of the body may still be on its way: the connection cannot carry
        // another request.
        response
            .headers_mut()
            .insert(header::CONNECTION, header::HeaderValue::from_static("close"));
    }
    response
}

/// A request body that fails with `BodyTimeout` once its deadline has passed.
struct DeadlineBody {
    body: Body,
    deadline: tokio::time::Instant,
    /// Made the first time the body has nothing to give, so that a body that arrives
    /// at once costs no timer.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl HttpBody for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let late = || Poll::Ready(Some(Err(axum::Error::new(BodyTimeout))));
        match Pin::new(&mut this.body).poll_frame(cx) {
            // Bytes that trickle in steadily still count against the deadline.
            Poll::Ready(Some(Ok(_))) if tokio::time::Instant::now() >= this.deadline => late(),
            Poll::Ready(frame) => Poll::Ready(frame),
            Poll::Pending => {
                let deadline = this.deadline;
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => late(),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Path parameters whose every failure (bad percent-encoding, bytes that are not UTF-8) is
/// an ApiError, like `JsonBody` for bodies.
pub struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(ApiPath(value)),
            Err(rejection) => Err(ApiError::bad_request(format!(
                "invalid path: {}",
                rejection.body_text()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body whose client has gone quiet.
    struct Stalled;

    impl HttpBody for Stalled {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Pending
        }
    }

    #[tokio::test]
    async fn a_stalled_body_is_a_timeout_at_its_deadline() {
        let body = Body::new(DeadlineBody {
            body: Body::new(Stalled),
            deadline: tokio::time::Instant::now() + Duration::from_millis(50),
            timer: None,
        });
        let e = read_body(body, 1024).await.unwrap_err();
        assert_eq!(e.status, StatusCode::REQUEST_TIMEOUT);
        assert_eq!(e.error_type, error_type::REQUEST_TIMEOUT);
    }

    #[tokio::test]
    async fn a_body_in_time_is_read_whole() {
        let body = Body::new(DeadlineBody {
            body: Body::from("{}"),
            deadline: tokio::time::Instant::now() + Duration::from_secs(60),
            timer: None,
        });
        assert_eq!(&read_body(body, 1024).await.unwrap()[..], b"{}");
    }

    #[test]
    fn a_timeout_is_found_inside_wrapping_errors() {
        let wrapped = axum::Error::new(axum::Error::new(BodyTimeout));
        assert!(body_timed_out(&wrapped));
        assert!(!body_timed_out(&axum::Error::new(std::io::Error::other("reset"))));
    }
}
