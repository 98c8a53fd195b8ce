//! The HTTP request span: the root of a request's spans in the router, and the child of the
//! client's span when the request carries W3C trace context (`traceparent`). The handler's spans
//! nest under it, and the engine's step spans link to the span that submitted the request.
use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

use crate::trace_context;

pub(crate) async fn request_span(request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().map_or(request.uri().path(), MatchedPath::as_str);
    let span = tracing::info_span!(
        "http_request",
        otel.name = %format_args!("{} {route}", request.method()),
        otel.kind = "server",
        http.request.method = %request.method(),
        http.route = route,
        http.response.status_code = tracing::field::Empty,
    );
    // Before the span is first entered: its parent is fixed when it starts.
    trace_context::set_remote_parent(&span, request.headers());
    let response = next.run(request).instrument(span.clone()).await;
    // As an integer attribute (tracing-opentelemetry records unsigned values as text).
    span.record("http.response.status_code", i64::from(response.status().as_u16()));
    response
}
