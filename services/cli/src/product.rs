//! `soldonce product`: the catalogue — add, show, update, take off sale and
//! put back, flash-sale limits.

use crate::admin::{catalog_error, sku};
use crate::database::pool;
use crate::output::Output;
use crate::CliError;
use anyhow::Context;
use clap::Subcommand;
use domain::Currency;
use std::process::ExitCode;
use store::catalog::{Product, ProductChange};

#[derive(Debug, Subcommand)]
pub enum ProductCommand {
    /// Add a product to the catalogue (with empty stock).
    Add {
        #[arg(long)]
        sku: String,
        #[arg(long)]
        name: String,
        /// Price in integer minor units (cents).
        #[arg(long, allow_negative_numbers = true)]
        price_minor: i64,
        /// ISO 4217 code, e.g. BRL.
        #[arg(long)]
        currency: String,
    },
    /// Show the catalogue (or one product): price, on sale or not, limits.
    Show {
        #[arg(long)]
        sku: Option<String>,
    },
    /// Change a product's name or price for orders placed from now on;
    /// orders already placed keep the prices they were placed at.
    Update {
        #[arg(long)]
        sku: String,
        #[arg(long)]
        name: Option<String>,
        /// New price in integer minor units.
        #[arg(long, allow_negative_numbers = true)]
        price_minor: Option<i64>,
        /// A new currency, only with --price-minor (an amount means nothing in another currency).
        #[arg(long, requires = "price_minor")]
        currency: Option<String>,
    },
    /// Take a product off sale: checkout refuses it (422 product-inactive)
    /// from the next placement on; orders already placed go on.
    Deactivate {
        #[arg(long)]
        sku: String,
    },
    /// Put a product back on sale.
    Activate {
        #[arg(long)]
        sku: String,
    },
    /// Set a SKU's flash-sale limits; `none` clears one, an omitted one is kept.
    Limit {
        #[arg(long)]
        sku: String,
        /// Units one order may ask for (422 beyond it), or `none`.
        #[arg(long, value_parser = limit)]
        max_per_order: Option<Limit>,
        /// Units one account may hold in pending or confirmed orders, ever ("one per customer": 1), or `none`.
        #[arg(long, value_parser = limit)]
        per_account: Option<Limit>,
    },
}

/// A limit's value on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Units(i64),
    None,
}

fn limit(text: &str) -> Result<Limit, String> {
    if text == "none" {
        return Ok(Limit::None);
    }
    match text.parse::<i64>() {
        Ok(n) if n > 0 => Ok(Limit::Units(n)),
        _ => Err(format!(
            "{text:?} is neither a positive number of units nor `none`"
        )),
    }
}

pub async fn run(cmd: ProductCommand, out: &Output) -> Result<ExitCode, CliError> {
    match cmd {
        ProductCommand::Add {
            sku,
            name,
            price_minor,
            currency,
        } => add(&sku, &name, price_minor, &currency, out).await,
        ProductCommand::Show { sku } => show(sku.as_deref(), out).await,
        ProductCommand::Update {
            sku,
            name,
            price_minor,
            currency,
        } => update(&sku, name, price_minor, currency.as_deref(), out).await,
        ProductCommand::Deactivate { sku } => set_active(&sku, false, out).await,
        ProductCommand::Activate { sku } => set_active(&sku, true, out).await,
        ProductCommand::Limit {
            sku,
            max_per_order,
            per_account,
        } => set_limits(&sku, max_per_order, per_account, out).await,
    }
}

fn currency(text: &str) -> Result<Currency, CliError> {
    text.parse()
        .map_err(|e| CliError::Usage(format!("--currency: {e}")))
}

fn price(price_minor: i64) -> Result<i64, CliError> {
    if price_minor < 0 {
        return Err(CliError::Usage("--price-minor must not be negative".into()));
    }
    Ok(price_minor)
}

fn name(name: &str) -> Result<&str, CliError> {
    if name.trim().is_empty() || name.chars().count() > 200 {
        return Err(CliError::Usage("--name must be 1-200 characters".into()));
    }
    Ok(name)
}

async fn add(
    s: &str,
    n: &str,
    price_minor: i64,
    c: &str,
    out: &Output,
) -> Result<ExitCode, CliError> {
    let (sku, currency, price_minor, name) = (sku(s)?, currency(c)?, price(price_minor)?, name(n)?);
    let pool = pool().await?;
    store::catalog::add_product(&pool, &sku, name, price_minor, currency)
        .await
        .map_err(catalog_error)?;
    let value = serde_json::json!({ "sku": sku, "name": name, "price_minor": price_minor, "currency": currency });
    out.print(&value, || {
        format!("added {sku} ({name}) at {price_minor} {currency}")
    });
    Ok(ExitCode::SUCCESS)
}

async fn show(s: Option<&str>, out: &Output) -> Result<ExitCode, CliError> {
    let sku = s.map(sku).transpose()?;
    let products = store::catalog::products(&pool().await?, sku.as_ref())
        .await
        .context("reading the catalogue")?;
    if let (Some(sku), true) = (&sku, products.is_empty()) {
        return Err(CliError::Usage(format!("--sku {sku}: no such product")));
    }
    out.print(&products, || {
        let mut t = format!(
            "{:<24} {:>12} {:<4} {:<9} {:>9} {:>11}  NAME",
            "SKU", "PRICE", "CUR", "ON SALE", "PER ORDER", "PER ACCOUNT"
        );
        let show = |v: Option<i64>| v.map_or("-".to_owned(), |n| n.to_string());
        for p in &products {
            t.push_str(&format!(
                "\n{:<24} {:>12} {:<4} {:<9} {:>9} {:>11}  {}",
                p.sku,
                p.price_minor,
                p.currency,
                if p.active { "yes" } else { "no" },
                show(p.max_per_order),
                show(p.per_account_limit),
                p.name
            ));
        }
        t
    });
    Ok(ExitCode::SUCCESS)
}

async fn update(
    s: &str,
    n: Option<String>,
    price_minor: Option<i64>,
    c: Option<&str>,
    out: &Output,
) -> Result<ExitCode, CliError> {
    let sku = sku(s)?;
    if n.is_none() && price_minor.is_none() {
        return Err(CliError::Usage(
            "give --name and/or --price-minor (with --currency to change the currency)".into(),
        ));
    }
    let change = ProductChange {
        name: n.as_deref().map(name).transpose()?.map(str::to_owned),
        price_minor: price_minor.map(price).transpose()?,
        currency: c.map(currency).transpose()?,
    };
    let product = store::catalog::update_product(&pool().await?, &sku, &change)
        .await
        .context("updating the product")?
        .ok_or_else(|| CliError::Usage(format!("--sku {sku}: no such product")))?;
    out.print(&product, || {
        format!(
            "{sku} ({}) now sells at {} {} to orders placed from now on; orders already placed keep their prices",
            product.name, product.price_minor, product.currency
        )
    });
    Ok(ExitCode::SUCCESS)
}

async fn set_active(s: &str, active: bool, out: &Output) -> Result<ExitCode, CliError> {
    let sku = sku(s)?;
    let (product, changed): (Product, bool) =
        store::catalog::set_active(&pool().await?, &sku, active)
            .await
            .context("updating the product")?
            .ok_or_else(|| CliError::Usage(format!("--sku {sku}: no such product")))?;
    let value = serde_json::json!({ "product": product, "changed": changed });
    out.print(&value, || {
        let was = if changed { "" } else { " (it already was)" };
        if active {
            format!("{sku} is on sale{was}")
        } else {
            format!(
                "{sku} is off sale{was}: checkout refuses it (422 product-inactive) from the next placement on; orders already placed go on"
            )
        }
    });
    Ok(ExitCode::SUCCESS)
}

async fn set_limits(
    s: &str,
    max_per_order: Option<Limit>,
    per_account: Option<Limit>,
    out: &Output,
) -> Result<ExitCode, CliError> {
    let sku = sku(s)?;
    if max_per_order.is_none() && per_account.is_none() {
        return Err(CliError::Usage(
            "give --max-per-order and/or --per-account (a number of units or `none`)".into(),
        ));
    }
    let pool = pool().await?;
    let current = store::catalog::prices(&pool, &[sku.as_str()])
        .await
        .context("reading the product")?;
    let Some(current) = current.get(sku.as_str()) else {
        return Err(CliError::Usage(format!("--sku {sku}: no such product")));
    };
    let pick = |given: Option<Limit>, kept: Option<i64>| match given {
        Some(Limit::Units(n)) => Some(n),
        Some(Limit::None) => None,
        None => kept,
    };
    let (max, per_account) = (
        pick(max_per_order, current.max_per_order),
        pick(per_account, current.per_account_limit),
    );
    store::catalog::set_limits(&pool, &sku, max, per_account)
        .await
        .context("setting the limits")?;
    let value =
        serde_json::json!({ "sku": sku, "max_per_order": max, "per_account_limit": per_account });
    let show = |v: Option<i64>| v.map_or("none".to_owned(), |n| n.to_string());
    out.print(&value, || {
        format!(
            "{sku}: at most {} per order, {} per account",
            show(max),
            show(per_account)
        )
    });
    Ok(ExitCode::SUCCESS)
}
