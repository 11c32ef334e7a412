//! Per-principal request rates, by route group: a principal over its group's rate gets
//! 429 `rate_limited` with `Retry-After` and `retry_after_seconds`, and no other
//! principal notices. The rates are the operator's (`rate_limit_exec`,
//! `rate_limit_sessions`, `rate_limit_files`); a group without one is not limited.
//!
//! Each rate `N/period` allows a burst of N requests, then one more every period / N
//! (GCRA, the `governor` crate): a client that keeps to the rate is never refused.

use crate::error::ApiError;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};
use sandcall_api::error_type;
use sandcall_auth::Principal;
pub use sandcall_config::rate::{Group, Rate};
use std::sync::Arc;
use std::time::Duration;

/// The group of a request, by its method and path; `None` for the routes that are never
/// limited (health, the OpenAPI document, the runtimes) and for
/// `POST /v1/exec/programmatic`, whose group depends on its body (a start or a resume)
/// and which its handler checks.
fn group_of(method: &Method, path: &str) -> Option<Group> {
    if path == "/v1/exec" {
        Some(Group::Exec)
    } else if path == "/v1/exec/programmatic" && method == Method::POST {
        None
    } else if path.starts_with("/v1/exec/programmatic/") {
        Some(Group::Sessions)
    } else if ["/v1/upload", "/v1/download/", "/v1/files/", "/v1/sessions/"]
        .iter()
        .any(|p| path.starts_with(p))
    {
        Some(Group::Files)
    } else {
        None
    }
}

/// The limiter's quota of a rate: a burst of N, then one more every period / N.
fn quota(rate: Rate) -> Option<Quota> {
    Quota::with_period(rate.per / rate.requests.get()).map(|q| q.allow_burst(rate.requests))
}

/// The limiters of every group that has a rate, keyed by principal.
#[derive(Clone, Default)]
pub struct RateLimits {
    groups: Arc<[Option<DefaultKeyedRateLimiter<String>>; 3]>,
}

impl RateLimits {
    /// The limiters of `config`'s rates (checked when the config was loaded).
    pub fn new(config: &sandcall_config::Config) -> RateLimits {
        let limiter = |g: Group| {
            let rate = config.rate_limit(g)?;
            Some(governor::RateLimiter::keyed(quota(rate)?))
        };
        RateLimits {
            groups: Arc::new(Group::ALL.map(limiter)),
        }
    }

    /// Counts one request of `principal` in `group`: `Err` (429) when it is over the
    /// group's rate, with how long until its next request would pass.
    pub fn check(&self, group: Group, principal: &Principal) -> Result<(), ApiError> {
        let Some(limiter) = &self.groups[group.index()] else {
            return Ok(());
        };
        limiter.check_key(&principal.0).map_err(|not_until| {
            let wait = not_until.wait_time_from(DefaultClock::default().now());
            // Whole seconds, rounded up: a client that waits this long passes.
            let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            ApiError {
                retry_after_s: Some(seconds.max(1)),
                ..ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    error_type::RATE_LIMITED,
                    format!(
                        "too many requests: this caller is over its rate for these routes ({}); retry later",
                        group.config_key()
                    ),
                )
            }
        })
    }

    /// Forgets principals whose allowance is whole again, so that the limiters hold
    /// only the principals seen lately.
    pub fn forget_idle(&self) {
        for limiter in self.groups.iter().flatten() {
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
    }
}

/// The middleware: checks the rate of the request's group, after authentication.
pub async fn limit(State(state): State<crate::AppState>, req: Request, next: Next) -> Response {
    let group = group_of(req.method(), req.uri().path());
    if let (Some(group), Some(principal)) = (group, req.extensions().get::<Principal>()) {
        if let Err(e) = state.rate_limits.check(group, principal) {
            return e.into_response();
        }
    }
    next.run(req).await
}

/// Forgets idle principals now and then.
pub async fn forget_idle_every(limits: RateLimits, every: Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        limits.forget_idle();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_and_refuse_nonsense() {
        let r: Rate = "60/min".parse().unwrap();
        assert_eq!((r.requests.get(), r.per), (60, Duration::from_secs(60)));
        let r: Rate = " 5 / s ".parse().unwrap();
        assert_eq!((r.requests.get(), r.per), (5, Duration::from_secs(1)));
        for bad in ["0/s", "60", "60/day", "-1/min", "x/h", ""] {
            assert!(bad.parse::<Rate>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn routes_fall_in_their_groups() {
        let get = Method::GET;
        let post = Method::POST;
        assert_eq!(group_of(&post, "/v1/exec"), Some(Group::Exec));
        assert_eq!(group_of(&post, "/v1/exec/programmatic"), None);
        assert_eq!(group_of(&get, "/v1/exec/programmatic/abc"), Some(Group::Sessions));
        assert_eq!(group_of(&post, "/v1/exec/programmatic/cancel"), Some(Group::Sessions));
        assert_eq!(group_of(&post, "/v1/upload/batch"), Some(Group::Files));
        assert_eq!(group_of(&get, "/v1/download/s/f"), Some(Group::Files));
        assert_eq!(group_of(&get, "/v1/sessions/s/objects/f"), Some(Group::Files));
        assert_eq!(group_of(&get, "/v1/health"), None);
        assert_eq!(group_of(&get, "/openapi.json"), None);
    }

    #[test]
    fn a_burst_over_the_rate_is_refused_with_the_wait_and_others_pass() {
        let config = sandcall_config::Config {
            limits: sandcall_config::LimitsConfig {
                rate_limit_exec: Some("3/min".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let limits = RateLimits::new(&config);
        let a = Principal("a".into());
        for _ in 0..3 {
            limits.check(Group::Exec, &a).unwrap();
        }
        let refused = limits.check(Group::Exec, &a).unwrap_err();
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(refused.error_type, error_type::RATE_LIMITED);
        // One request comes back every 20 s.
        assert!(
            matches!(refused.retry_after_s, Some(19..=20)),
            "{:?}",
            refused.retry_after_s
        );
        // Another principal, and another group, are not affected.
        limits.check(Group::Exec, &Principal("b".into())).unwrap();
        for _ in 0..10 {
            limits.check(Group::Files, &a).unwrap();
        }
    }
}
