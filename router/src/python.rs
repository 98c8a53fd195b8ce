//! The pyo3 boundary: a thin shim that parses arguments and calls the Rust entry points.
//! `serve(argv)` runs the router on its own tokio runtime with the GIL released, until SIGINT
//! or SIGTERM (then drains), or until the engine gives up on its shard (then raises, and the
//! process exits non-zero).
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use tokio_util::sync::CancellationToken;

use crate::config::RouterConfig;
use crate::telemetry::{self, TelemetryConfig};

/// Runs the router. `argv` excludes the program name. Returns when the server has stopped
/// after a signal; raises `ValueError` for bad arguments and `RuntimeError` if serving fails.
#[pyfunction]
fn serve(py: Python<'_>, argv: Vec<String>) -> PyResult<()> {
    let argv = std::iter::once("superinfer-router".to_string()).chain(argv);
    let config = match RouterConfig::parse_argv(argv) {
        Ok(config) => config,
        Err(error) if !error.use_stderr() => {
            // --help and --version: print and return normally.
            print!("{error}");
            return Ok(());
        }
        Err(error) => return Err(PyValueError::new_err(error.render().to_string())),
    };
    py.detach(|| run_until_signal(config)).map_err(PyRuntimeError::new_err)
}

fn run_until_signal(config: RouterConfig) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("superinfer-router")
        .build()
        .map_err(|error| format!("cannot start the tokio runtime: {error}"))?;
    runtime.block_on(async move {
        let _telemetry = telemetry::init(&TelemetryConfig {
            log_level: &config.log_level,
            json_output: config.json_output,
            otlp_endpoint: config.otlp_endpoint.as_deref(),
            otlp_service_name: &config.otlp_service_name,
        })
        .map_err(|error| error.to_string())?;
        let shutdown = CancellationToken::new();
        tokio::spawn(cancel_on_signal(shutdown.clone()));
        let result = crate::server::run(config, shutdown).await;
        if let Err(error) = &result {
            tracing::error!(%error, "router failed");
        }
        result.map_err(|error| error.to_string())
    })
}

/// The first SIGINT or SIGTERM stops the router gracefully (`server::run` drains); a second
/// one during the drain exits at once.
async fn cancel_on_signal(stop: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let (mut interrupt, mut terminate) = match (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) {
        (Ok(interrupt), Ok(terminate)) => (interrupt, terminate),
        (Err(error), _) | (_, Err(error)) => {
            tracing::error!(%error, "cannot install signal handlers; stop the router by killing it");
            return;
        }
    };
    tokio::select! {
        _ = interrupt.recv() => tracing::info!("SIGINT received, draining"),
        _ = terminate.recv() => tracing::info!("SIGTERM received, draining"),
        _ = stop.cancelled() => return,
    }
    stop.cancel();
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    tracing::warn!("second signal during the drain: exiting now");
    std::process::exit(130);
}

/// The router's flags (name, help, env, default, takes_value) as JSON, for the launcher.
#[pyfunction]
fn router_flags() -> PyResult<String> {
    serde_json::to_string(&RouterConfig::flag_specs()).map_err(|error| PyRuntimeError::new_err(error.to_string()))
}

/// Parses router arguments (and the environment) as the router will, and checks the values
/// that need no model (`RouterConfig::check_values`); `None` when they are valid, else clap's
/// message or the check's. Lets the launcher fail before it loads a model.
#[pyfunction]
fn check_router_args(argv: Vec<String>) -> Option<String> {
    let argv = std::iter::once("superinfer-router".to_string()).chain(argv);
    match RouterConfig::parse_argv(argv) {
        Err(error) => Some(error.render().to_string()),
        Ok(config) => config.check_values().err().map(|error| error.to_string()),
    }
}

#[pymodule]
fn _router(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(serve, m)?)?;
    m.add_function(wrap_pyfunction!(router_flags, m)?)?;
    m.add_function(wrap_pyfunction!(check_router_args, m)?)?;
    m.add_function(wrap_pyfunction!(crate::simulate::simulate, m)?)?;
    m.add_function(wrap_pyfunction!(crate::contracts::percentile, m)?)?;
    m.add_function(wrap_pyfunction!(crate::contracts::meets, m)?)?;
    m.add_function(wrap_pyfunction!(crate::contracts::default_stall_factor, m)?)?;
    m.add_function(wrap_pyfunction!(crate::contracts::scheduler_defaults, m)?)?;
    m.add_function(wrap_pyfunction!(crate::contracts::fit_step_cost, m)?)?;
    m.add_function(wrap_pyfunction!(crate::contracts::step_time, m)?)?;
    m.add_function(wrap_pyfunction!(crate::contracts::token_curve_knots, m)?)?;
    m.add_function(wrap_pyfunction!(crate::contracts::fit_step_curve, m)?)?;
    Ok(())
}
