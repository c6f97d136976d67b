//! Helpers for the changes made to a payment after its creation: capture, cancel, the buyer's
//! action, disputes, and reading a payment by id.

use psp_sim::model::Payment;
use serde_json::{json, Value};

use crate::support::{payment_body, TestApp};

impl TestApp {
    /// POSTs a keyed change (`capture` or `cancel`) with an optional JSON body.
    pub async fn change(
        &self,
        payment_id: &str,
        change: &str,
        key: &str,
        body: Option<Value>,
    ) -> reqwest::Response {
        let request = self
            .client
            .post(self.url(&format!("/v1/payments/{payment_id}/{change}")))
            .header("Idempotency-Key", key);
        let request = match body {
            Some(body) => request.json(&body),
            None => request,
        };
        request.send().await.unwrap()
    }

    pub async fn capture(
        &self,
        payment_id: &str,
        key: &str,
        body: Option<Value>,
    ) -> reqwest::Response {
        self.change(payment_id, "capture", key, body).await
    }

    pub async fn cancel(&self, payment_id: &str, key: &str) -> reqwest::Response {
        self.change(payment_id, "cancel", key, None).await
    }

    /// The simulated buyer ends the 3-D Secure step.
    pub async fn act(&self, payment_id: &str, outcome: &str) -> reqwest::Response {
        self.client
            .post(self.url(&format!("/v1/payments/{payment_id}/action")))
            .json(&json!({ "outcome": outcome }))
            .send()
            .await
            .unwrap()
    }

    pub async fn dispute(&self, payment_id: &str, body: Option<Value>) -> reqwest::Response {
        let request = self
            .client
            .post(self.url(&format!("/admin/payments/{payment_id}/dispute")));
        let request = match body {
            Some(body) => request.json(&body),
            None => request,
        };
        request.send().await.unwrap()
    }

    /// `GET /v1/payments/{id}`, which must answer 200.
    pub async fn payment(&self, payment_id: &str) -> Payment {
        let response = self
            .client
            .get(self.url(&format!("/v1/payments/{payment_id}")))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        response.json().await.unwrap()
    }

    /// A new payment with `capture_method: manual`, which must be created.
    pub async fn pay_manual(&self, reference: &str, amount_minor: i64) -> Payment {
        let mut body = payment_body(amount_minor, reference);
        body["capture_method"] = json!("manual");
        let response = self.pay(&format!("pay:{reference}"), &body).await;
        assert_eq!(response.status(), 201);
        response.json().await.unwrap()
    }
}

/// A 200 answer's payment.
pub async fn ok(response: reqwest::Response) -> Payment {
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}
