//! Resuming a paused session: continuation tokens (single use, altered ones refused),
//! results that answer some of the pending calls, retries that get the first answer,
//! concurrent resumes, and sessions that are unknown or have ended.

use super::support::{
    altered, assert_api_error, assert_completed_shape, assert_paused_shape, drive_from, ok, ok_result, rate_tool,
    resume, resume_with, session_id, src, start, state, tool, ROUTE,
};
use crate::common::Server;
use serde_json::{json, Value};

#[test]
fn tokens() {
    let s = Server::start();
    let body = json!({
        "language": "python",
        "code": src(&["a = add(a=1, b=2)", "b = add(a=a, b=10)", "print(a, b)"]),
        "tools": [tool("add", json!({"a": {"type": "integer"}, "b": {"type": "integer"}}), &["a", "b"])],
    });
    let first = start(&s, &body);
    assert_paused_shape(&first);
    let call = first["tool_calls"][0].clone();
    assert_eq!(call["arguments"], json!({"a": 1, "b": 2}), "{first}");
    let token1 = first["continuation_token"].as_str().unwrap().to_owned();

    // Results that answer no pending call, or one twice, or one that is not pending:
    // 400, token kept.
    let bogus_id = json!("AAAAAAAAAAAAAAAAAAAAA");
    assert_ne!(bogus_id, call["id"]);
    for results in [
        json!([]),
        json!([ok_result(&bogus_id, json!(3))]),
        json!([ok_result(&call["id"], json!(3)), ok_result(&call["id"], json!(3))]),
        json!([ok_result(&call["id"], json!(3)), ok_result(&bogus_id, json!(3))]),
    ] {
        let (code, v) = resume(&s, &first, results.clone());
        assert_api_error(code, &v, 400, "invalid_tool_results");
        let (code, st) = state(&s, &session_id(&first));
        assert_eq!(code, 200, "{st}");
        assert_eq!(st["status"], "tool_call_required", "after {results}: {st}");
        assert_eq!(st["continuation_token"], token1.as_str(), "after {results}: {st}");
    }

    // An altered token (its signature does not verify), or one that does not parse: 400,
    // which LibreChat's client tells the model is a rejected request, not a lack of
    // authorization.
    let forged = altered(&token1);
    for bad in [forged.as_str(), "not-a-token"] {
        let (code, v) = resume_with(&s, &first, bad, json!([ok_result(&call["id"], json!(3))]));
        assert_api_error(code, &v, 400, "invalid_continuation_token");
    }

    // The real token still works after all of the above.
    let (code, second) = resume(&s, &first, json!([ok_result(&call["id"], json!(3))]));
    assert_eq!(code, 200, "{second}");
    assert_paused_shape(&second);
    assert_eq!(second["session_id"], first["session_id"]);
    assert_ne!(
        second["continuation_token"],
        token1.as_str(),
        "a new pause has a new token"
    );
    assert_eq!(
        second["tool_calls"][0]["arguments"],
        json!({"a": 3, "b": 10}),
        "{second}"
    );

    // Second use of a used token with the same results is a retry: it answers what the
    // first use answered. With other results: 409, and the session stays where it is.
    let (code, again) = resume_with(&s, &first, &token1, json!([ok_result(&call["id"], json!(3))]));
    assert_eq!(code, 200, "{again}");
    assert_eq!(again, second, "a retry answers what the first use answered");
    let (code, v) = resume_with(&s, &first, &token1, json!([ok_result(&call["id"], json!(4))]));
    assert_api_error(code, &v, 409, "continuation_token_used");
    let (code, v) = resume_with(
        &s,
        &first,
        &token1,
        json!([ok_result(&second["tool_calls"][0]["id"], json!(13))]),
    );
    assert_api_error(code, &v, 409, "continuation_token_used");

    let out = drive_from(&s, second.clone(), |_, args| {
        ok(json!(args["a"].as_i64().unwrap() + args["b"].as_i64().unwrap()))
    });
    assert_eq!(out.rounds, 1);
    assert_eq!(out.last["status"], "completed", "{}", out.last);
    assert_eq!(out.last["stdout"], "3 13\n", "{}", out.last);
    assert_eq!(out.last["tool_calls_made"], 2, "{}", out.last);

    // The last token is used up too: a retry of its resume answers the ending, and
    // so does any resume of the ended session (never 409, which LibreChat shows as
    // "temporarily unavailable").
    let (code, v) = resume(
        &s,
        &second,
        json!([ok_result(&second["tool_calls"][0]["id"], json!(13))]),
    );
    assert_eq!(code, 200, "{v}");
    assert_eq!(v, out.last);
    let (code, v) = resume_with(&s, &first, &token1, json!([ok_result(&call["id"], json!(5))]));
    assert_eq!(code, 200, "{v}");
    assert_eq!(v, out.last);
}

#[test]
fn resume_may_omit_session_id() {
    let s = Server::start();
    let body = json!({
        "language": "python",
        "code": src(&["print(get_exchange_rate(base=\"USD\", quote=\"EUR\"))"]),
        "tools": [rate_tool()],
    });
    let first = start(&s, &body);
    assert_paused_shape(&first);
    let (code, r) = s.post(
        ROUTE,
        &json!({
            "code": "",
            "continuation_token": first["continuation_token"],
            "tool_results": [ok_result(&first["tool_calls"][0]["id"], json!(0.92))],
        }),
    );
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["session_id"], first["session_id"], "{r}");
    assert_eq!(r["stdout"], "0.92\n", "{r}");
}

#[test]
fn unknown_sessions_are_404() {
    let s = Server::start();
    let (code, v) = state(&s, "AAAAAAAAAAAAAAAAAAAAA");
    assert_api_error(code, &v, 404, "session_not_found");
    let (code, v) = s.post(
        &format!("{ROUTE}/cancel"),
        &json!({"session_id": "AAAAAAAAAAAAAAAAAAAAA"}),
    );
    assert_api_error(code, &v, 404, "session_not_found");
}

#[test]
fn concurrent_resumes_with_one_token_exactly_one_wins() {
    let s = Server::start();
    for round in 0..5 {
        let first = start(
            &s,
            &json!({"language": "python", "code": "print(get_exchange_rate(base='USD', quote='EUR'))", "tools": [rate_tool()]}),
        );
        let call = first["tool_calls"][0]["id"].clone();
        let answers: Vec<(u16, Value)> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..2)
                .map(|i| {
                    let (s, first, call) = (&s, &first, &call);
                    scope.spawn(move || resume(s, first, json!([ok_result(call, json!(i))])))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let won: Vec<&Value> = answers.iter().filter(|(c, _)| *c == 200).map(|(_, v)| v).collect();
        let lost: Vec<&Value> = answers.iter().filter(|(c, _)| *c == 409).map(|(_, v)| v).collect();
        assert_eq!((won.len(), lost.len()), (1, 1), "round {round}: {answers:?}");
        assert_eq!(lost[0]["error_type"], "continuation_token_used");
        assert_eq!(won[0]["status"], "completed", "{}", won[0]);
        assert!(won[0]["stdout"] == "0\n" || won[0]["stdout"] == "1\n", "{}", won[0]);
    }
}

#[test]
fn a_resume_may_answer_some_of_the_pending_calls() {
    let s = Server::start();
    let body = json!({
        "language": "python",
        "code": src(&[
            "r = await asyncio.gather(t(n=1), t(n=2), t(n=3))",
            "print(r)",
        ]),
        "tools": [tool("t", json!({"n": {"type": "integer"}}), &["n"])],
    });
    let first = start(&s, &body);
    assert_paused_shape(&first);
    let calls = first["tool_calls"].as_array().unwrap().clone();
    assert_eq!(calls.len(), 3, "{first}");
    let by_n = |n: i64| calls.iter().find(|c| c["arguments"]["n"] == n).unwrap().clone();

    // Answer only n=2: the next pause lists the other two, under their ids, with a new
    // token.
    let (code, second) = resume(&s, &first, json!([ok_result(&by_n(2)["id"], json!(20))]));
    assert_eq!(code, 200, "{second}");
    assert_paused_shape(&second);
    assert_ne!(second["continuation_token"], first["continuation_token"]);
    let mut left: Vec<String> = second["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap().to_owned())
        .collect();
    left.sort();
    let mut want = vec![
        by_n(1)["id"].as_str().unwrap().to_owned(),
        by_n(3)["id"].as_str().unwrap().to_owned(),
    ];
    want.sort();
    assert_eq!(left, want, "{second}");

    // A retry of the partial resume answers the same pause again.
    let (code, again) = resume(&s, &first, json!([ok_result(&by_n(2)["id"], json!(20))]));
    assert_eq!(code, 200, "{again}");
    assert_eq!(again, second);

    // The answered call cannot be answered again; the others can.
    let (code, v) = resume(&s, &second, json!([ok_result(&by_n(2)["id"], json!(0))]));
    assert_api_error(code, &v, 400, "invalid_tool_results");
    let (code, third) = resume(&s, &second, json!([ok_result(&by_n(3)["id"], json!(30))]));
    assert_eq!(code, 200, "{third}");
    assert_paused_shape(&third);
    assert_eq!(third["tool_calls"].as_array().unwrap().len(), 1, "{third}");
    assert_eq!(third["tool_calls"][0]["id"], by_n(1)["id"]);
    let (code, done) = resume(&s, &third, json!([ok_result(&by_n(1)["id"], json!(10))]));
    assert_eq!(code, 200, "{done}");
    assert_completed_shape(&done);
    assert_eq!(done["stdout"], "[10, 20, 30]\n", "{done}");
    assert_eq!(done["tool_calls_made"], 3, "{done}");
}

#[test]
fn an_ended_session_answers_its_ending() {
    let s = Server::start();
    let body = json!({"language": "python", "code": "print(get_exchange_rate(base='USD', quote='EUR'))", "tools": [rate_tool()]});
    let first = start(&s, &body);
    assert_paused_shape(&first);
    let (code, cancelled) = s.post(&format!("{ROUTE}/cancel"), &json!({"session_id": first["session_id"]}));
    assert_eq!(code, 200, "{cancelled}");
    assert_eq!(cancelled["error_type"], "cancelled", "{cancelled}");
    // The client's resume after that (and its retry) gets the ending, 200, not 409.
    for _ in 0..2 {
        let (code, v) = resume(&s, &first, json!([ok_result(&first["tool_calls"][0]["id"], json!(1))]));
        assert_eq!(code, 200, "{v}");
        assert_eq!(v["status"], "error", "{v}");
        assert_eq!(v["error_type"], "cancelled", "{v}");
        assert_eq!(v, cancelled);
    }
}

#[test]
fn concurrent_retries_with_the_same_results_get_the_same_answer() {
    let s = Server::start();
    for round in 0..3 {
        let first = start(
            &s,
            &json!({"language": "python", "code": "print(get_exchange_rate(base='USD', quote='EUR'))", "tools": [rate_tool()]}),
        );
        let call = first["tool_calls"][0]["id"].clone();
        let answers: Vec<(u16, Value)> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..3)
                .map(|_| {
                    let (s, first, call) = (&s, &first, &call);
                    scope.spawn(move || resume(s, first, json!([ok_result(call, json!(0.5))])))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (code, v) in &answers {
            assert_eq!(*code, 200, "round {round}: {answers:?}");
            assert_eq!(*v, answers[0].1, "round {round}: every retry gets the one answer");
        }
        assert_eq!(answers[0].1["status"], "completed", "{}", answers[0].1);
        assert_eq!(answers[0].1["stdout"], "0.5\n", "{}", answers[0].1);
    }
}
