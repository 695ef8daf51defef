//! The agent's callers file (`--callers`, D59) as `Callers::parse` reads it: every input
//! ends in callers or an error message, and the callers parsed answer the questions the
//! agent asks of them (a token's caller, its domains and limits, its rate) without a panic.

#![no_main]

use allot_agent::callers::Callers;
use allot_proto::tls::Peer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(callers) = Callers::parse(text) else {
        return;
    };
    let by_token = ["Bearer secret", "Bearer ", "bearer x", text].map(|a| (None, Some(a)));
    let gateway = Peer::Gateway("edge".to_owned());
    for (peer, authorization) in by_token.into_iter().chain([(Some(&gateway), None)]) {
        if let Some(caller) = callers.identify(peer, authorization) {
            let _ = caller.may("default");
            let _ = caller.may_limit("default/generic_key");
            let _ = caller.take_call();
        }
    }
});
