//! The OpenAPI document, built from the same route list as the router.

use std::sync::OnceLock;

use axum::response::Response;
use serde_json::{json, Map, Value};

use super::{routes, In, Out};
use sandcove_core::wire::{FRAMES_CONTENT_TYPE, IDEMPOTENCY_HEADER, PID_HEADER};

pub(super) async fn serve_document() -> Response {
    super::json(document())
}

/// The document (built once).
pub(super) fn document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(build)
}

fn schema_of(type_name: &str) -> Value {
    match type_name.strip_suffix("[]") {
        Some(item) => json!({"type": "array", "items": schema_of(item)}),
        None => json!({
            "type": "object",
            "description": format!("the JSON (serde) form of sandcove's `{type_name}`"),
        }),
    }
}

fn build() -> Value {
    let mut paths: Map<String, Value> = Map::new();
    for route in routes() {
        let mut parameters: Vec<Value> = route
            .path
            .split('/')
            .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
            .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
            .collect();
        for name in route.query {
            parameters.push(json!({"name": name, "in": "query", "required": *name == "path", "schema": {"type": "string"}}));
        }
        if route.summary.contains("Idempotency-Key") {
            parameters.push(json!({"name": IDEMPOTENCY_HEADER, "in": "header", "required": false, "schema": {"type": "string"}}));
        }
        let mut op = json!({
            "operationId": route.op,
            "summary": route.summary,
            "parameters": parameters,
            "responses": {
                "default": {
                    "description": "an error",
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
                },
            },
        });
        match route.input {
            In::None => {}
            In::Json(t) => {
                op["requestBody"] = json!({"required": true, "content": {"application/json": {"schema": schema_of(t)}}});
            }
            In::Raw => {
                op["requestBody"] = json!({"required": true, "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}});
            }
            In::Upload => {
                op["requestBody"] = json!({"required": true, "content": {
                    FRAMES_CONTENT_TYPE: {"schema": {"type": "string", "format": "binary", "description": "`d` frames, then `x` to commit or `!` (an Error) to abandon; the answer comes once an abandoned write is discarded"}},
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary", "description": "the file's bytes; a body that breaks off is abandoned"}},
                }});
            }
        }
        op["responses"]["200"] = match route.output {
            Out::Json(t) => {
                json!({"description": "success", "content": {"application/json": {"schema": schema_of(t)}}})
            }
            Out::Frames(what) => {
                let mut r = json!({"description": format!("{what}, as a frame stream (kind byte, big-endian u32 length, payload)"), "content": {FRAMES_CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"}}}});
                if route.op == "spawn" || route.op == "attach" {
                    r["headers"] = json!({PID_HEADER: {"schema": {"type": "integer"}}});
                }
                r
            }
            Out::Empty => json!({"description": "done, no body"}),
        };
        if route.op == "pull_image" {
            // Asked for with `Accept:`, the pull streams its progress instead.
            op["responses"]["200"]["content"][FRAMES_CONTENT_TYPE] = json!({"schema": {
                "type": "string", "format": "binary",
                "description": "with `Accept: application/vnd.sandcove.frames`: `j` frames of PullEvent (`{\"progress\": ImagePullProgress}` for each layer's progress, then `{\"pulled\": ImageSummary}`), or an `!` frame (an Error)",
            }});
        }
        if matches!(route.output, Out::Empty) {
            let ok = op["responses"]["200"].take();
            op["responses"]
                .as_object_mut()
                .expect("object")
                .remove("200");
            op["responses"]["204"] = ok;
        }
        let item = paths
            .entry(route.path.to_string())
            .or_insert_with(|| json!({}));
        item[route.method.as_str().to_ascii_lowercase()] = op;
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "sandcove",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Sandboxes over HTTP: the sandcove Backend trait, one route per method.",
        },
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["code", "message"],
                    "properties": {
                        "code": {"type": "string", "enum": [
                            "not_found", "already_exists", "conflict", "invalid_argument", "timeout",
                            "permission_denied", "unauthenticated", "invalid_state",
                            "not_supported", "unavailable", "rate_limited", "file_too_large",
                            "io", "backend"
                        ]},
                        "message": {"type": "string"},
                        "fields": {"type": "object"},
                    },
                },
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use sandcove_core::ErrorCode;

    /// The document lists exactly the routes the router is built from.
    #[test]
    fn the_document_lists_exactly_the_served_routes() {
        let served: BTreeSet<(String, String)> = routes()
            .iter()
            .map(|r| (r.method.as_str().to_ascii_lowercase(), r.path.to_string()))
            .collect();
        let doc = document();
        let documented: BTreeSet<(String, String)> = doc["paths"]
            .as_object()
            .unwrap()
            .iter()
            .flat_map(|(path, item)| {
                item.as_object()
                    .unwrap()
                    .keys()
                    .map(move |m| (m.clone(), path.clone()))
            })
            .collect();
        assert_eq!(served, documented);
        assert_eq!(served.len(), routes().len(), "no route is listed twice");
    }

    /// Every error code of the enum is in the document's error schema.
    #[test]
    fn the_error_schema_names_every_code() {
        let codes = &document()["components"]["schemas"]["Error"]["properties"]["code"]["enum"];
        for code in [
            ErrorCode::NotFound,
            ErrorCode::AlreadyExists,
            ErrorCode::Conflict,
            ErrorCode::InvalidArgument,
            ErrorCode::Timeout,
            ErrorCode::PermissionDenied,
            ErrorCode::Unauthenticated,
            ErrorCode::InvalidState,
            ErrorCode::NotSupported,
            ErrorCode::Unavailable,
            ErrorCode::RateLimited,
            ErrorCode::FileTooLarge,
            ErrorCode::Io,
            ErrorCode::Backend,
        ] {
            let name = serde_json::to_value(code).unwrap();
            assert!(codes.as_array().unwrap().contains(&name), "{name}");
        }
    }
}
