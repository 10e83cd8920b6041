//! Running a [`Prepared`] request: the client, each hop under the allow-list and its
//! [`REACH`], redirects, and the capped body.

use std::error::Error;
use std::sync::Arc;

use reqwest::header;
use reqwest::{Client, Method, Response, StatusCode};

use super::address::{AddressClass, REACH, Refused, Resolver};
use super::pattern::{AllowList, Target, TargetHost};
use super::wire::{Output, Prepared};
use crate::provider::{ErrorCode, Failure};

/// The client every request of one [`Http`](super::Http) shares, with its connection
/// pool.
///
/// - TLS is rustls with `ring`, verifying with the system's roots; on a system without
///   any, HTTPS fails its handshakes and plain HTTP still works.
/// - No proxy: a proxy would resolve and connect in our stead, out of the resolver's
///   reach, so environment variables such as `HTTP_PROXY` are ignored.
/// - No redirects: [`execute`] follows them itself, checking each hop.
/// - HTTP/1.1 only (the `http2` feature of reqwest is off: one less protocol to build).
///
/// # Errors
///
/// If the TLS configuration or the client cannot be built.
pub(super) fn build() -> anyhow::Result<Client> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| anyhow::anyhow!("failed to configure TLS: {e}"))?;
    // `dangerous` because the verifier is not rustls's own; it verifies, against the
    // system's roots, as strictly.
    let mut tls = match rustls_platform_verifier::Verifier::new(provider) {
        Ok(verifier) => builder.dangerous().with_custom_certificate_verifier(Arc::new(verifier)).with_no_client_auth(),
        Err(e) => {
            tracing::warn!(error = %e, "no root certificates for the http provider's TLS: https requests will fail");
            builder.with_root_certificates(rustls::RootCertStore::empty()).with_no_client_auth()
        }
    };
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Client::builder()
        .tls_backend_preconfigured(tls)
        .dns_resolver(Arc::new(Resolver))
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .referer(false)
        .build()
        .map_err(|e| anyhow::anyhow!("failed to build the http client: {e}"))
}

/// What [`execute`] needs besides the request.
pub(super) struct Rules<'a> {
    pub(super) allow: &'a AllowList,
    pub(super) max_response_body: usize,
    pub(super) max_redirects: usize,
}

/// Runs `request`, following redirects, and reads its answer.
///
/// Each hop is connected inside [`REACH`] scoped to its own URL's reach, so the resolver
/// filters each hop's addresses by the patterns that admitted that hop. A redirect is
/// checked like the first URL (scheme, allow-list, then addresses when connecting).
///
/// # Errors
///
/// `denied` for a redirect no pattern admits or a name resolving only to addresses its
/// hop may not reach; `limit` past `max_redirects` or `max_response_body`;
/// `unavailable` when the server cannot be reached or breaks off.
pub(super) async fn execute(client: &Client, rules: &Rules<'_>, request: Prepared) -> Result<Output, Failure> {
    let mut hop = request;
    let mut redirects = 0;
    loop {
        let mut builder = client.request(hop.method.clone(), hop.url.clone()).headers(hop.headers.clone());
        if let Some(body) = &hop.body {
            builder = builder.body(body.clone());
        }
        let response = REACH.scope(hop.reach, builder.send()).await.map_err(|e| failure(&e, &hop.target))?;
        let Some(location) = redirect_location(&response) else {
            return read(response, &hop.target, rules.max_response_body).await;
        };
        if redirects == rules.max_redirects {
            return Err(Failure::new(
                ErrorCode::Limit,
                format!(
                    "more than {} redirects; the last, from {}, to `{location}`",
                    rules.max_redirects,
                    hop.target.origin()
                ),
            ));
        }
        redirects += 1;
        let mut next = hop.url.join(&location).map_err(|e| {
            Failure::new(
                ErrorCode::Unavailable,
                format!("{} redirected to `{location}`, which is not a URL: {e}", hop.target.origin()),
            )
        })?;
        next.set_fragment(None);
        let target = Target::of(&next)?;
        let reach = rules.allow.admit(&target)?;
        hop = follow(hop, response.status(), next, target, reach);
    }
}

/// The `Location` of a redirect that should be followed, if `response` is one.
fn redirect_location(response: &Response) -> Option<String> {
    let redirect = matches!(
        response.status(),
        StatusCode::MOVED_PERMANENTLY
            | StatusCode::FOUND
            | StatusCode::SEE_OTHER
            | StatusCode::TEMPORARY_REDIRECT
            | StatusCode::PERMANENT_REDIRECT
    );
    let location = response.headers().get(header::LOCATION)?;
    // A `Location` that is not text is not followed: the 3xx is the answer.
    redirect.then(|| location.to_str().ok().map(str::to_owned)).flatten()
}

/// The next hop after a `status` redirect to `url`, as browsers and reqwest do it: 303,
/// and 301 or 302 after a POST, become a GET without the body; 307 and 308 repeat the
/// request. Credentials go only to the origin they were given for.
fn follow(
    mut hop: Prepared,
    status: StatusCode,
    url: url::Url,
    target: Target,
    reach: super::address::Reach,
) -> Prepared {
    let to_get = match status {
        StatusCode::SEE_OTHER => hop.method != Method::HEAD,
        StatusCode::MOVED_PERMANENTLY | StatusCode::FOUND => hop.method == Method::POST,
        _ => false,
    };
    if to_get {
        hop.method = Method::GET;
        hop.body = None;
        for name in [header::CONTENT_TYPE, header::CONTENT_ENCODING, header::CONTENT_LANGUAGE, header::CONTENT_LOCATION]
        {
            hop.headers.remove(name);
        }
    }
    if !hop.target.same_origin(&target) {
        for name in [header::AUTHORIZATION, header::COOKIE, header::WWW_AUTHENTICATE] {
            hop.headers.remove(name);
        }
        hop.headers.remove("cookie2");
    }
    Prepared { url, target, reach, ..hop }
}

/// The answer, its body read up to `max` bytes: a body past that fails `limit` as soon
/// as its declared length or the bytes read so far pass it, so no more than `max` bytes
/// (and the chunk that passed them) are ever held.
async fn read(mut response: Response, target: &Target, max: usize) -> Result<Output, Failure> {
    let limit = |message: String| Failure::new(ErrorCode::Limit, message);
    let declared = response.content_length().and_then(|n| usize::try_from(n).ok());
    if let Some(declared) = declared
        && declared > max
    {
        return Err(limit(format!("the answer from {} is {declared} bytes, over the limit of {max}", target.origin())));
    }
    let mut body = Vec::with_capacity(declared.unwrap_or(0));
    while let Some(chunk) = response.chunk().await.map_err(|e| failure(&e, target))? {
        let read = body.len() + chunk.len();
        if read > max {
            return Err(limit(format!(
                "the answer from {} passed the limit of {max} bytes ({read} bytes read)",
                target.origin()
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Output::new(response.status().as_u16(), response.headers(), body))
}

/// The failure of a request to `target` that the client reported as `error`.
fn failure(error: &reqwest::Error, target: &Target) -> Failure {
    let mut sources = Vec::new();
    let mut source = error.source();
    while let Some(error) = source {
        if let Some(refused) = error.downcast_ref::<Refused>() {
            return refused_failure(refused, target);
        }
        sources.push(error.to_string());
        source = error.source();
    }
    // The top error's text repeats the URL, credentials and all: only its sources say
    // more.
    let detail = if sources.is_empty() { error.to_string() } else { sources.join(": ") };
    let code = if error.is_timeout() { ErrorCode::Timeout } else { ErrorCode::Unavailable };
    Failure::new(code, format!("request to {} failed: {detail}", target.origin()))
}

/// `denied` for a name that resolved only to addresses its hop may not reach, saying
/// how to reach it if that is meant.
fn refused_failure(refused: &Refused, target: &Target) -> Failure {
    let address = Target {
        host: match refused.address {
            std::net::IpAddr::V4(ip) => TargetHost::Ipv4(ip),
            std::net::IpAddr::V6(ip) => TargetHost::Ipv6(ip),
        },
        ..target.clone()
    };
    let how = match (&target.host, refused.class) {
        (TargetHost::Name(name), AddressClass::Loopback) if name == "localhost" => {
            format!("grant it with --allow-host {}", target.grant())
        }
        _ => format!("to reach it, grant --allow-host {} and use the address in the URL", address.grant()),
    };
    Failure::new(
        ErrorCode::Denied,
        format!(
            "{} is not allowed: {} resolves to {}, {}, and a pattern of a DNS name admits public addresses only, \
             or loopback for `localhost` ({how})",
            target.origin(),
            target.host,
            refused.address,
            refused.class.describe(),
        ),
    )
}
