//! The JSON of `http.request`: its [`Input`], checked into a [`Prepared`] request on the
//! worker that dispatched it, and its [`Output`].

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use reqwest::Method;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};
use url::Url;

use super::address::Reach;
use super::pattern::{AllowList, Target};
use crate::provider::{ErrorCode, Failure};

/// The methods a request may use. Not `CONNECT` (a tunnel to anywhere, past the
/// allow-list's view of what is sent) and not `TRACE` (it echoes the request's
/// headers back, credentials included).
const METHODS: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"];

/// Headers the client alone sets. Connections are pooled across processes, so a
/// process that could frame its own request (`content-length`, `transfer-encoding`) or
/// steer the connection (`connection`, `upgrade`…) could desynchronise one that
/// another process's request reuses next; `host` would make the request name a site
/// other than the one the allow-list admitted.
const RESERVED_HEADERS: [&str; 10] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "proxy-connection",
    "proxy-authorization",
];

/// `http.request`'s input.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Input {
    #[serde(default = "get")]
    method: String,
    url: String,
    #[serde(default)]
    headers: Vec<(String, String)>,
    body: Option<String>,
    body_base64: Option<String>,
}

fn get() -> String {
    "GET".to_owned()
}

/// `http.request`'s answer: `body` when the body is UTF-8, else `body_base64`.
#[derive(Debug, Serialize)]
pub(super) struct Output {
    pub(super) status: u16,
    pub(super) headers: Vec<(String, String)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) body: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) body_base64: Option<String>,
}

impl Output {
    pub(super) fn new(status: u16, headers: &HeaderMap, body: Vec<u8>) -> Output {
        let headers = headers
            .iter()
            .map(|(name, value)| (name.as_str().to_owned(), String::from_utf8_lossy(value.as_bytes()).into_owned()))
            .collect();
        match String::from_utf8(body) {
            Ok(text) => Output { status, headers, body: Some(text), body_base64: None },
            Err(bytes) => Output { status, headers, body: None, body_base64: Some(BASE64.encode(bytes.as_bytes())) },
        }
    }
}

/// A request that passed every check that needs no network: ready to run.
#[derive(Debug, Clone)]
pub(super) struct Prepared {
    pub(super) method: Method,
    pub(super) url: Url,
    pub(super) target: Target,
    pub(super) reach: Reach,
    pub(super) headers: HeaderMap,
    pub(super) body: Option<Bytes>,
}

/// Checks `input` against the allow-list and the limits.
///
/// # Errors
///
/// `invalid` for a malformed method, URL, header or body; `denied` for a URL no
/// pattern admits; `limit` for a body over `max_body` bytes.
pub(super) fn prepare(input: Input, allow: &AllowList, max_body: usize) -> Result<Prepared, Failure> {
    let invalid = |message: String| Failure::new(ErrorCode::Invalid, message);
    let method = match METHODS.contains(&input.method.as_str()) {
        true => Method::from_bytes(input.method.as_bytes()).expect("the listed methods are valid"),
        false => {
            return Err(invalid(format!("unsupported method `{}`; one of {}", input.method, METHODS.join(", "))));
        }
    };
    let mut url = Url::parse(&input.url).map_err(|e| invalid(format!("`{}` is not a URL: {e}", input.url)))?;
    url.set_fragment(None);
    let target = Target::of(&url)?;
    let reach = allow.admit(&target)?;
    let mut headers = HeaderMap::with_capacity(input.headers.len());
    for (name, value) in input.headers {
        let header =
            HeaderName::from_bytes(name.as_bytes()).map_err(|_| invalid(format!("bad header name `{name}`")))?;
        if RESERVED_HEADERS.contains(&header.as_str()) {
            return Err(invalid(format!("the header `{header}` is the client's to set")));
        }
        let value = HeaderValue::from_str(&value)
            .map_err(|_| invalid(format!("bad value for the header `{header}`: control characters")))?;
        headers.append(header, value);
    }
    let body = match (input.body, input.body_base64) {
        (Some(_), Some(_)) => return Err(invalid("give `body` or `body_base64`, not both".to_owned())),
        (Some(text), None) => Some(Bytes::from(text)),
        (None, Some(encoded)) => {
            Some(Bytes::from(BASE64.decode(encoded).map_err(|e| invalid(format!("`body_base64` is not base64: {e}")))?))
        }
        (None, None) => None,
    };
    if let Some(body) = &body
        && body.len() > max_body
    {
        return Err(Failure::new(
            ErrorCode::Limit,
            format!("the request body is {} bytes, over the limit of {max_body}", body.len()),
        ));
    }
    Ok(Prepared { method, url, target, reach, headers, body })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::http::HostPattern;

    fn input(json: serde_json::Value) -> Input {
        serde_json::from_value(json).unwrap()
    }

    fn allow() -> AllowList {
        AllowList::new(vec![HostPattern::parse("example.com").unwrap()])
    }

    fn failure(json: serde_json::Value) -> Failure {
        prepare(input(json), &allow(), 8).unwrap_err()
    }

    #[test]
    fn defaults_and_bodies() {
        let get = prepare(input(serde_json::json!({ "url": "http://example.com/a#frag" })), &allow(), 8).unwrap();
        assert_eq!((get.method, get.url.as_str(), get.body), (Method::GET, "http://example.com/a", None));
        let post = serde_json::json!({
            "method": "POST", "url": "https://example.com/", "headers": [["x-a", "1"], ["X-A", "2"]], "body_base64": "AP8=",
        });
        let post = prepare(input(post), &allow(), 8).unwrap();
        assert_eq!(post.body.as_deref(), Some(&[0, 255][..]));
        assert_eq!(post.headers.get_all("x-a").iter().count(), 2);
    }

    #[test]
    fn bad_input_is_invalid_and_big_bodies_are_over_the_limit() {
        let f = failure(serde_json::json!({ "method": "CONNECT", "url": "http://example.com/" }));
        assert_eq!(f.code, ErrorCode::Invalid);
        assert!(f.message.contains("unsupported method `CONNECT`; one of GET, HEAD"), "{f}");
        assert!(failure(serde_json::json!({ "url": "example.com" })).message.contains("is not a URL"));
        assert!(failure(serde_json::json!({ "url": "ftp://example.com/" })).message.contains("scheme `ftp`"));
        let f = failure(serde_json::json!({ "url": "http://example.com/", "headers": [["Host", "a"]] }));
        assert_eq!(f.message, "the header `host` is the client's to set");
        let f = failure(serde_json::json!({ "url": "http://example.com/", "headers": [["a b", "c"]] }));
        assert!(f.message.contains("bad header name `a b`"));
        let f = failure(serde_json::json!({ "url": "http://example.com/", "headers": [["a", "x\ny"]] }));
        assert!(f.message.contains("bad value for the header `a`"));
        let f = failure(serde_json::json!({ "url": "http://example.com/", "body": "a", "body_base64": "YQ==" }));
        assert!(f.message.contains("not both"));
        assert!(
            failure(serde_json::json!({ "url": "http://example.com/", "body_base64": "!" })).message.contains("base64")
        );
        let f = failure(serde_json::json!({ "url": "http://example.com/", "body": "123456789" }));
        assert_eq!(f.to_string(), "limit: the request body is 9 bytes, over the limit of 8");
        assert_eq!(failure(serde_json::json!({ "url": "http://other.example/" })).code, ErrorCode::Denied);
        assert!(serde_json::from_value::<Input>(serde_json::json!({ "url": "x", "header": [] })).is_err());
    }

    #[test]
    fn answers_carry_text_or_base64() {
        let text = serde_json::to_value(Output::new(200, &HeaderMap::new(), b"hi".to_vec())).unwrap();
        assert_eq!(text, serde_json::json!({ "status": 200, "headers": [], "body": "hi" }));
        let binary = serde_json::to_value(Output::new(200, &HeaderMap::new(), vec![0xff, 0])).unwrap();
        assert_eq!(binary, serde_json::json!({ "status": 200, "headers": [], "body_base64": "/wA=" }));
    }
}
