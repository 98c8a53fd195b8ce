//! Request-side plumbing shared by the routes: a JSON body extractor whose failures are
//! `HttpError`s (TGI's JSON error body instead of axum's plain text), and the API-key check.
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

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

/// `Authorization: Bearer <api_key>` on the generation routes (case-insensitive, as TGI).
pub(crate) async fn require_api_key(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(api_key) = &state.config.api_key else {
        return next.run(request).await;
    };
    let expected = format!("bearer {}", api_key.to_lowercase());
    let given = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .map(str::to_lowercase);
    if given.as_deref() == Some(expected.as_str()) {
        next.run(request).await
    } else {
        HttpError::Unauthorized.into_response()
    }
}
