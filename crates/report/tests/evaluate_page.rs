//! The evaluation page: what it says and draws for a hand-made evaluation.

mod common;

use tessera_report::evaluate_report;

#[test]
fn the_page_names_every_configuration_the_recommendation_and_the_model_check() {
    let v = common::verdict();
    let html = evaluate_report(&v, "evaluation", "a test");
    assert!(!html.contains("chart not drawn"), "a chart failed");
    assert!(!html.contains("NaN") && !html.contains("<script"));
    assert_eq!(html.matches("<svg").count(), 4);
    for o in &v.outcomes {
        assert!(
            html.contains(&format!("<td>{}</td>", o.name)),
            "{} in the table",
            o.name
        );
    }
    assert!(html.contains(&v.recommendation.replace('\'', "&#39;")));
    // Five measured points, each predicted from the other four, and one prediction.
    assert_eq!(v.scaling.checks.len(), 5);
    assert_eq!(v.scaling.predictions.len(), 1);
    assert!(html.contains("predicted by the model fitted on the others"));
    assert!(
        v.scaling.worst_error().is_some_and(|e| e < 0.2),
        "{:?}",
        v.scaling.checks
    );
}

#[test]
fn too_few_configurations_for_the_model_say_so() {
    let plan = tessera_evaluate::Plan::parse(
        "[prices.n]\npurchase = 1\nhourly = 1\n[[config]]\nname = \"one\"\nhosts = 1\n\
         host = \"n\"\nmemory = \"1GiB\"\nbandwidth = \"1Gbit\"\n",
    )
    .unwrap();
    let run = tessera_evaluate::Run {
        seconds: 2.0,
        ..Default::default()
    };
    let v = tessera_evaluate::rank(&plan, &[vec![run]], 2.0);
    let html = evaluate_report(&v, "evaluation", "a test");
    assert!(html.contains("the model needs 3"), "{html}");
    assert_eq!(html.matches("<svg").count(), 3);
}
