//! Each rule: the parameter that breaks it, and TGI's message.
use super::*;

const LIMITS: ValidationLimits = ValidationLimits {
    max_best_of: 2,
    max_stop_sequences: 4,
    max_top_n_tokens: 5,
    max_input_tokens: 1024,
    max_total_tokens: 2048,
};

fn check(parameters: GenerateParameters) -> Result<ValidParameters, ValidationError> {
    validate_parameters(&parameters, &LIMITS, 42)
}

fn message(parameters: GenerateParameters) -> String {
    check(parameters)
        .expect_err("the rule must reject this")
        .to_string()
}

#[test]
fn defaults_are_greedy_and_unrestricted() {
    let valid = check(GenerateParameters::default()).unwrap();
    assert!(!valid.sampling.do_sample);
    assert_eq!(valid.sampling.temperature, 1.0);
    assert_eq!(
        (
            valid.sampling.top_k,
            valid.sampling.top_p,
            valid.sampling.typical_p
        ),
        (0, 1.0, 1.0)
    );
    assert_eq!(valid.sampling.repetition_penalty, 1.0);
    assert_eq!(valid.sampling.frequency_penalty, 0.0);
    assert_eq!(valid.best_of, 1);
    assert_eq!(valid.max_new_tokens, None);
}

#[test]
fn sampling_without_seed_takes_the_random_one_and_a_given_seed_is_kept() {
    let sampled = check(GenerateParameters {
        do_sample: true,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(sampled.sampling.seed, 42);
    let seeded = check(GenerateParameters {
        seed: Some(7),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(seeded.sampling.seed, 7);
}

#[test]
fn a_warper_turns_sampling_on() {
    let valid = check(GenerateParameters {
        top_k: Some(5),
        ..Default::default()
    })
    .unwrap();
    assert!(valid.sampling.do_sample);
    assert_eq!(valid.sampling.top_k, 5);
}

#[test]
fn best_of_rules() {
    let bad = |best_of| GenerateParameters {
        best_of: Some(best_of),
        do_sample: true,
        ..Default::default()
    };
    assert_eq!(message(bad(0)), "`best_of` must be > 0 and <= 2. Given: 0");
    assert_eq!(message(bad(3)), "`best_of` must be > 0 and <= 2. Given: 3");
    let greedy = GenerateParameters {
        best_of: Some(2),
        ..Default::default()
    };
    assert_eq!(
        message(greedy),
        "you must use sampling when `best_of` is > 1"
    );
    let seeded = GenerateParameters {
        seed: Some(1),
        ..bad(2)
    };
    assert_eq!(message(seeded), "`seed` must not be set when `best_of` > 1");
    assert_eq!(check(bad(2)).unwrap().best_of, 2);
}

#[test]
fn sampling_value_rules() {
    let cases: Vec<(GenerateParameters, &str)> = vec![
        (
            GenerateParameters {
                temperature: Some(0.0),
                ..Default::default()
            },
            "`temperature` must be strictly positive",
        ),
        (
            GenerateParameters {
                temperature: Some(-1.0),
                ..Default::default()
            },
            "`temperature` must be strictly positive",
        ),
        (
            GenerateParameters {
                repetition_penalty: Some(0.0),
                ..Default::default()
            },
            "`repetition_penalty` must be strictly positive",
        ),
        (
            GenerateParameters {
                frequency_penalty: Some(2.5),
                ..Default::default()
            },
            "`frequency_penalty` must be >= -2.0 and <= 2.0",
        ),
        (
            GenerateParameters {
                frequency_penalty: Some(-2.5),
                ..Default::default()
            },
            "`frequency_penalty` must be >= -2.0 and <= 2.0",
        ),
        (
            GenerateParameters {
                top_p: Some(1.0),
                ..Default::default()
            },
            "`top_p` must be > 0.0 and < 1.0",
        ),
        (
            GenerateParameters {
                top_p: Some(0.0),
                ..Default::default()
            },
            "`top_p` must be > 0.0 and < 1.0",
        ),
        (
            GenerateParameters {
                typical_p: Some(1.5),
                ..Default::default()
            },
            "`typical_p` must be > 0.0 and < 1.0",
        ),
        (
            GenerateParameters {
                top_k: Some(0),
                ..Default::default()
            },
            "`top_k` must be strictly positive",
        ),
        (
            GenerateParameters {
                max_new_tokens: Some(0),
                ..Default::default()
            },
            "`max_new_tokens` must be strictly positive",
        ),
        (
            GenerateParameters {
                top_n_tokens: Some(6),
                ..Default::default()
            },
            "`top_n_tokens` must be >= 0 and <= 5. Given: 6",
        ),
        (
            GenerateParameters {
                truncate: Some(0),
                ..Default::default()
            },
            "`truncate` must be strictly positive and less than 1024. Given: 0",
        ),
        (
            GenerateParameters {
                truncate: Some(1025),
                ..Default::default()
            },
            "`truncate` must be strictly positive and less than 1024. Given: 1025",
        ),
    ];
    for (parameters, expected) in cases {
        assert_eq!(message(parameters), expected);
    }
}

#[test]
fn stop_sequence_count_is_limited() {
    let stop = |n: usize| GenerateParameters {
        stop: vec!["x".into(); n],
        ..Default::default()
    };
    assert_eq!(
        message(stop(5)),
        "`stop` supports up to 4 stop sequences. Given: 5"
    );
    assert_eq!(check(stop(4)).unwrap().stop.len(), 4);
}

#[test]
fn grammars_are_parsed_and_watermark_is_not_supported() {
    let grammar = |value| GenerateParameters { grammar: Some(value), ..Default::default() };
    let parsed = check(grammar(serde_json::json!({"type": "regex", "value": "a+"}))).unwrap();
    assert_eq!(parsed.grammar, Some(crate::grammar::GrammarSpec::Regex("a+".into())));
    assert!(message(grammar(serde_json::json!({"type": "yaml", "value": "a"})))
        .starts_with("grammar is not valid: unknown variant `yaml`"));
    let watermark = GenerateParameters {
        watermark: true,
        ..Default::default()
    };
    assert_eq!(message(watermark), "watermark is not supported");
}

#[test]
fn slo_must_be_positive() {
    let slo = |ttft_ms, tbt_ms| GenerateParameters {
        slo: Some(SloParameters { ttft_ms, tbt_ms, max_stall_ms: None }),
        ..Default::default()
    };
    assert_eq!(
        message(slo(0.0, 50.0)),
        "`slo.ttft_ms` must be a strictly positive number of milliseconds"
    );
    assert_eq!(
        message(slo(100.0, f64::NAN)),
        "`slo.tbt_ms` must be a strictly positive number of milliseconds"
    );
    let valid = check(slo(100.0, 50.0)).unwrap();
    assert_eq!(valid.slo, Some(Slo { ttft_s: 0.1, tbt_s: 0.05, max_stall_s: 0.25 }));
}

#[test]
fn the_stall_bound_is_checked_and_defaults_to_a_multiple_of_tbt() {
    let slo = |max_stall_ms| GenerateParameters {
        slo: Some(SloParameters { ttft_ms: 500.0, tbt_ms: 50.0, max_stall_ms }),
        ..Default::default()
    };
    assert_eq!(
        message(slo(Some(20.0))),
        "`slo.max_stall_ms` must be at least `slo.tbt_ms` (50). Given: 20"
    );
    assert_eq!(
        message(slo(Some(-1.0))),
        "`slo.max_stall_ms` must be a strictly positive number of milliseconds"
    );
    assert_eq!(check(slo(Some(400.0))).unwrap().slo.unwrap().max_stall_s, 0.4);
    assert_eq!(check(slo(None)).unwrap().slo.unwrap().max_stall_s, 0.25);
}

#[test]
fn priority_is_an_integer_class_zero_by_default() {
    let priority = |priority| GenerateParameters { priority, ..Default::default() };
    assert_eq!(check(priority(None)).unwrap().priority, 0);
    assert_eq!(check(priority(Some(-3))).unwrap().priority, -3);
    assert_eq!(
        message(priority(Some(5_000_000))),
        "`priority` must be an integer between -1000000 and 1000000. Given: 5000000"
    );
}

#[test]
fn streaming_rejects_best_of_and_prefill_details() {
    let best_of = check(GenerateParameters {
        best_of: Some(2),
        do_sample: true,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        validate_stream(&best_of, true).unwrap_err().to_string(),
        "`best_of` != 1 is not supported when streaming tokens"
    );
    let prefill = check(GenerateParameters {
        decoder_input_details: true,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        validate_stream(&prefill, false).unwrap_err().to_string(),
        "`decoder_input_details` == true is not supported when streaming tokens"
    );
    assert!(validate_stream(&prefill, true).is_ok());
}

#[test]
fn length_rules_in_tgi_order() {
    assert_eq!(validate_length(10, Some(20), &LIMITS), Ok(20));
    // Unset max_new_tokens fills what max_total_tokens leaves.
    assert_eq!(validate_length(48, None, &LIMITS), Ok(2000));
    assert_eq!(
        validate_length(100, Some(2000), &LIMITS).unwrap_err().to_string(),
        "`inputs` tokens + `max_new_tokens` must be <= 2048. Given: 100 `inputs` tokens and 2000 `max_new_tokens`"
    );
    assert_eq!(
        validate_length(1030, Some(10), &LIMITS)
            .unwrap_err()
            .to_string(),
        "`inputs` must have less than 1024 tokens. Given: 1030"
    );
    assert_eq!(
        validate_length(0, Some(10), &LIMITS)
            .unwrap_err()
            .to_string(),
        "`inputs` cannot be empty"
    );
}

#[test]
fn truncation_keeps_at_most_the_limit() {
    assert_eq!(truncated_length(100, Some(10)), 10);
    assert_eq!(truncated_length(5, Some(10)), 5);
    assert_eq!(truncated_length(5, None), 5);
}

#[test]
fn non_finite_sampling_values_are_refused_by_name() {
    let cases: Vec<(GenerateParameters, &str)> = vec![
        (
            GenerateParameters {
                temperature: Some(f32::INFINITY),
                ..Default::default()
            },
            "temperature",
        ),
        (
            GenerateParameters {
                repetition_penalty: Some(f32::INFINITY),
                ..Default::default()
            },
            "repetition_penalty",
        ),
        (
            GenerateParameters {
                frequency_penalty: Some(f32::NEG_INFINITY),
                ..Default::default()
            },
            "frequency_penalty",
        ),
        (
            GenerateParameters {
                top_p: Some(f32::NAN),
                ..Default::default()
            },
            "top_p",
        ),
        (
            GenerateParameters {
                typical_p: Some(f32::INFINITY),
                ..Default::default()
            },
            "typical_p",
        ),
    ];
    for (parameters, name) in cases {
        assert_eq!(message(parameters), format!("`{name}` must be a finite number"));
    }
    // What serde makes of 1e308 for an f32 field: the rule sees an infinity.
    let parsed: GenerateParameters =
        serde_json::from_value(serde_json::json!({"temperature": 1e308})).unwrap();
    assert_eq!(message(parsed), "`temperature` must be a finite number");
    // Tiny positive values stay valid (the shard treats such temperatures as greedy).
    let tiny = check(GenerateParameters {
        temperature: Some(1e-45),
        ..Default::default()
    })
    .unwrap();
    assert!(tiny.sampling.temperature > 0.0);
}

#[test]
fn each_stop_sequence_is_limited_in_bytes_and_empty_ones_pass() {
    let stop = |sequence: String| GenerateParameters {
        stop: vec!["ok".into(), sequence],
        ..Default::default()
    };
    let longest = "é".repeat(MAX_STOP_SEQUENCE_BYTES / 2);
    assert_eq!(check(stop(longest)).unwrap().stop.len(), 2);
    assert_eq!(
        message(stop("x".repeat(MAX_STOP_SEQUENCE_BYTES + 1))),
        "each stop sequence must be at most 1024 bytes long. Given: 1025"
    );
    // The stop matcher skips empty sequences, so they cannot end or break a generation.
    assert_eq!(check(stop(String::new())).unwrap().stop[1], "");
}

#[test]
fn slo_is_bounded_above_by_an_hour() {
    let slo = |ttft_ms, tbt_ms| GenerateParameters {
        slo: Some(SloParameters { ttft_ms, tbt_ms, max_stall_ms: None }),
        ..Default::default()
    };
    assert_eq!(
        message(slo(1e30, 100.0)),
        "`slo.ttft_ms` must be at most 3600000 milliseconds. Given: 1000000000000000000000000000000"
    );
    assert_eq!(
        message(slo(100.0, f64::INFINITY)),
        "`slo.tbt_ms` must be a strictly positive number of milliseconds"
    );
    assert!(check(slo(MAX_SLO_MS, MAX_SLO_MS)).is_ok());
}

#[test]
fn prompt_bytes_are_bounded_before_tokenizing() {
    // 1024 tokens of at most 16 bytes hold at most 16384 bytes.
    assert_eq!(validate_prompt_bytes(16_384, Some(16), &LIMITS), Ok(()));
    assert_eq!(
        validate_prompt_bytes(16_385, Some(16), &LIMITS)
            .unwrap_err()
            .to_string(),
        "`inputs` must have less than 1024 tokens. Given: 16385 bytes, more than 1024 tokens of at most 16 bytes each can hold"
    );
    // Without a guaranteed bound per token, only the tokenizer can tell.
    assert_eq!(validate_prompt_bytes(usize::MAX, None, &LIMITS), Ok(()));
}
