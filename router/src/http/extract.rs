//! Request-side plumbing shared by the routes: a JSON body extractor whose failures are
//! `HttpError`s (TGI's JSON error body instead of axum's plain text), and the API-key check.
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use subtle::ConstantTimeEq;

use super::state::AppState;
use crate::error::HttpError;

/// `axum::Json`, with rejections mapped to 413 (body over the payload limit) or 422.
pub(crate) struct JsonBody<T>(pub T);

impl<T> FromRequest<Arc<AppState>> for JsonBody<T>
where
    axum::Json<T>: FromRequest<Arc<AppState>, Rejection = JsonRejection>,
{
    type Rejection = HttpError;

    async fn from_request(
        request: Request,
        state: &Arc<AppState>,
    ) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(request, state).await {
            Ok(axum::Json(value)) => Ok(JsonBody(value)),
            Err(rejection) => Err(map_rejection(rejection, state.config.payload_limit)),
        }
    }
}

fn map_rejection(rejection: JsonRejection, payload_limit: usize) -> HttpError {
    if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
        return HttpError::PayloadTooLarge(payload_limit);
    }
    HttpError::BadRequestBody(rejection.body_text())
}

/// `Authorization: Bearer <api_key>` on the generation routes.
pub(crate) async fn require_api_key(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(api_key) = &state.config.api_key else {
        return next.run(request).await;
    };
    let given = request
        .headers()
        .get(AUTHORIZATION)
        .map(|value| value.as_bytes());
    if given.is_some_and(|given| bearer_matches(given, api_key.as_bytes())) {
        next.run(request).await
    } else {
        HttpError::Unauthorized.into_response()
    }
}

/// Whether an `Authorization` value is `Bearer <key>`: the scheme in any case (RFC 7235), the
/// key exactly and compared in constant time, so that the time taken does not reveal how much
/// of a guess was right.
fn bearer_matches(header: &[u8], key: &[u8]) -> bool {
    const SCHEME: &[u8] = b"bearer ";
    if header.len() < SCHEME.len() || !header[..SCHEME.len()].eq_ignore_ascii_case(SCHEME) {
        return false;
    }
    // Unequal lengths answer at once: the key's length is all that timing can reveal.
    header[SCHEME.len()..].ct_eq(key).into()
}

#[cfg(test)]
mod tests {
    use super::bearer_matches;

    #[test]
    fn scheme_is_case_insensitive_and_the_key_exact() {
        assert!(bearer_matches(b"Bearer s3cret", b"s3cret"));
        assert!(bearer_matches(b"bEaReR s3cret", b"s3cret"));
        assert!(!bearer_matches(b"Bearer S3CRET", b"s3cret"));
        assert!(!bearer_matches(b"Bearer s3cre", b"s3cret"));
        assert!(!bearer_matches(b"Bearer s3cret ", b"s3cret"));
        assert!(!bearer_matches(b"Basic s3cret", b"s3cret"));
        assert!(!bearer_matches(b"Bearers3cret", b"s3cret"));
        assert!(!bearer_matches(b"s3cret", b"s3cret"));
        assert!(!bearer_matches(b"", b"s3cret"));
    }
}
