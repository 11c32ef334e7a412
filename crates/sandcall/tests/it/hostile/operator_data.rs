//! Finding 6 of issue 25: a tenant watches the others. `/metrics` shows every tenant's
//! runs, uploads, tool calls and stored bytes, so only the operator's `metrics_token`
//! opens it, never a tenant's API key or JWT; and `/v1/health` with a tenant's key shows
//! that tenant's own runs and sessions, not the server's.

use crate::common::Server;
use crate::files::Client;
use crate::metrics::{operator, METRICS_TOKEN};
use crate::principals::start_paused;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

/// `local` is also the one principal of local mode: a tenant of that name is still a
/// tenant.
const KEYS: &str = "alice:key-a-0123456789abcdef,bob:key-b-0123456789abcdef,local:key-l-0123456789abcdef";
const ALICE: &str = "key-a-0123456789abcdef";
const BOB: &str = "key-b-0123456789abcdef";
const HS_SECRET: &str = "a-development-secret-of-32-bytes-or-more";

/// A valid HS256 JWT for `sub` (the server below allows HS256 with `HS_SECRET`).
fn jwt(sub: &str) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = json!({
        "iss": "librechat", "aud": "codeapi", "sub": sub, "tenant_id": "t",
        "iat": now, "nbf": now, "exp": now + 60, "jti": format!("j-{}", rand::random::<u64>()),
        "principal_source": "librechat_jwt", "auth_context_hash": "h",
    });
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("hs256-dev".into());
    jsonwebtoken::encode(
        &header,
        &claims,
        &EncodingKey::from_secret(HS_SECRET.as_bytes()).unwrap(),
    )
    .unwrap()
}

fn server(metrics_token: bool) -> Server {
    let mut env = vec![
        ("SANDCALL_API_KEYS", KEYS),
        ("CODEAPI_JWT_HS256_SECRET", HS_SECRET),
        ("CODEAPI_JWT_ALLOWED_ALGS", "HS256"),
    ];
    if metrics_token {
        env.push(("SANDCALL_METRICS_TOKEN", METRICS_TOKEN));
    }
    Server::start_with(&env, "")
}

#[test]
fn metrics_open_to_the_operators_token_only() {
    let s = server(true);
    let alice = Client::bearer(&s, ALICE);
    // Alice is a real tenant: her key and her JWT work on her own routes.
    assert_eq!(alice.post_json("/v1/exec", &json!({"code": "print(1)"})).status, 200);
    let token = jwt("alice");
    assert_eq!(Client::bearer(&s, &token).get("/v1/files/none").status, 200);
    for (who, client) in [
        ("no credentials", Client::anonymous(&s)),
        ("a tenant's bearer key", Client::bearer(&s, ALICE)),
        ("a tenant's X-API-Key", Client::api_key(&s, ALICE)),
        ("a tenant's JWT", Client::bearer(&s, &token)),
        ("the token as X-API-Key", Client::api_key(&s, METRICS_TOKEN)),
        ("a wrong token", Client::bearer(&s, "metrics-token-0123456789abcdeX")),
    ] {
        let reply = client.get("/metrics");
        assert_eq!(reply.status, 401, "{who}: {reply}");
        assert_eq!(reply.json()["error_type"], "unauthorized", "{who}: {reply}");
        assert!(
            !String::from_utf8_lossy(&reply.body).contains("sandcall_"),
            "{who}: {reply}"
        );
    }
    let scrape = operator(&s).get("/metrics");
    assert_eq!(scrape.status, 200, "{scrape}");
    assert!(String::from_utf8_lossy(&scrape.body).contains("sandcall_runs_total"));
    // The operator's token is no tenant: it runs nothing.
    assert_eq!(
        operator(&s).post_json("/v1/exec", &json!({"code": "print(1)"})).status,
        401
    );

    // Without metrics_token, a server with credentials has no /metrics for anyone.
    let closed = server(false);
    for client in [Client::bearer(&closed, ALICE), Client::bearer(&closed, METRICS_TOKEN)] {
        let reply = client.get("/metrics");
        assert_eq!(reply.status, 401, "{reply}");
        assert!(
            reply.json()["error"].as_str().unwrap().contains("metrics_token"),
            "{reply}"
        );
    }
}

#[test]
fn health_shows_a_tenant_its_own_figures_only() {
    let s = server(true);
    let bob = Client::bearer(&s, BOB);
    // Bob holds a paused session.
    let paused = start_paused(&bob);
    assert_eq!(paused["status"], "tool_call_required", "{paused}");
    let health = |c: &Client| -> Value {
        let reply = c.get("/v1/health");
        assert_eq!(reply.status, 200, "{reply}");
        reply.json()
    };
    let mine = health(&Client::bearer(&s, ALICE));
    assert_eq!(mine["sessions"], 0, "alice sees bob's session: {mine}");
    assert_eq!(mine["active_runs"], 0, "{mine}");
    for global in ["paused_sessions", "queued_runs", "warm_idle"] {
        assert!(mine.get(global).is_none(), "alice sees the server's {global}: {mine}");
    }
    assert_eq!(health(&Client::bearer(&s, &jwt("carol")))["sessions"], 0);
    let named_local = health(&Client::bearer(&s, "key-l-0123456789abcdef"));
    assert_eq!(named_local["sessions"], 0, "{named_local}");
    assert!(named_local.get("warm_idle").is_none(), "{named_local}");
    assert_eq!(health(&bob)["sessions"], 1, "bob sees his own");
    // The operator sees the server's.
    let all = health(&operator(&s));
    assert_eq!(
        (&all["sessions"], &all["paused_sessions"]),
        (&json!(1), &json!(1)),
        "{all}"
    );
    assert!(all["warm_idle"].is_u64(), "{all}");
}
