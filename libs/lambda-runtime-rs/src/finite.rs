//! `check(&value)`: whether a `Serialize` value is JSON, before serde_json sees it.
//!
//! Invariant: serde_json writes a NaN or an infinite float as `null` (and `json!`/`to_value` make
//! it `Value::Null`), so a result holding one would silently change meaning; this walk refuses
//! it instead, as the Python and TypeScript runtimes do. It serializes nothing: every method
//! only visits, and the first non-finite float ends the walk with an error.
use std::fmt;

use serde::ser::{self, Serialize};

#[derive(Debug)]
pub(crate) struct NotJson(pub String);

impl fmt::Display for NotJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NotJson {}

impl ser::Error for NotJson {
    fn custom<T: fmt::Display>(message: T) -> NotJson {
        NotJson(message.to_string())
    }
}

/// `Err` naming the problem when `value` holds a NaN or an infinite float.
pub(crate) fn check<T: Serialize + ?Sized>(value: &T) -> Result<(), NotJson> {
    value.serialize(Check)
}

struct Check;

type Done = Result<(), NotJson>;

fn float(value: f64) -> Done {
    if value.is_finite() {
        Ok(())
    } else {
        Err(NotJson("NaN or Infinity".into()))
    }
}

impl ser::Serializer for Check {
    type Ok = ();
    type Error = NotJson;
    type SerializeSeq = Check;
    type SerializeTuple = Check;
    type SerializeTupleStruct = Check;
    type SerializeTupleVariant = Check;
    type SerializeMap = Check;
    type SerializeStruct = Check;
    type SerializeStructVariant = Check;

    fn serialize_bool(self, _: bool) -> Done { Ok(()) }
    fn serialize_i8(self, _: i8) -> Done { Ok(()) }
    fn serialize_i16(self, _: i16) -> Done { Ok(()) }
    fn serialize_i32(self, _: i32) -> Done { Ok(()) }
    fn serialize_i64(self, _: i64) -> Done { Ok(()) }
    fn serialize_u8(self, _: u8) -> Done { Ok(()) }
    fn serialize_u16(self, _: u16) -> Done { Ok(()) }
    fn serialize_u32(self, _: u32) -> Done { Ok(()) }
    fn serialize_u64(self, _: u64) -> Done { Ok(()) }
    fn serialize_f32(self, value: f32) -> Done { float(f64::from(value)) }
    fn serialize_f64(self, value: f64) -> Done { float(value) }
    fn serialize_char(self, _: char) -> Done { Ok(()) }
    fn serialize_str(self, _: &str) -> Done { Ok(()) }
    fn serialize_bytes(self, _: &[u8]) -> Done { Ok(()) }
    fn serialize_none(self) -> Done { Ok(()) }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Done { value.serialize(Check) }
    fn serialize_unit(self) -> Done { Ok(()) }
    fn serialize_unit_struct(self, _: &'static str) -> Done { Ok(()) }
    fn serialize_unit_variant(self, _: &'static str, _: u32, _: &'static str) -> Done { Ok(()) }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> Done {
        value.serialize(Check)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(self, _: &'static str, _: u32, _: &'static str, value: &T) -> Done {
        value.serialize(Check)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Check, NotJson> { Ok(Check) }
    fn serialize_tuple(self, _: usize) -> Result<Check, NotJson> { Ok(Check) }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Check, NotJson> { Ok(Check) }
    fn serialize_tuple_variant(self, _: &'static str, _: u32, _: &'static str, _: usize) -> Result<Check, NotJson> {
        Ok(Check)
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Check, NotJson> { Ok(Check) }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Check, NotJson> { Ok(Check) }
    fn serialize_struct_variant(self, _: &'static str, _: u32, _: &'static str, _: usize) -> Result<Check, NotJson> {
        Ok(Check)
    }
}

impl ser::SerializeSeq for Check {
    type Ok = ();
    type Error = NotJson;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Done { value.serialize(Check) }
    fn end(self) -> Done { Ok(()) }
}

impl ser::SerializeTuple for Check {
    type Ok = ();
    type Error = NotJson;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Done { value.serialize(Check) }
    fn end(self) -> Done { Ok(()) }
}

impl ser::SerializeTupleStruct for Check {
    type Ok = ();
    type Error = NotJson;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Done { value.serialize(Check) }
    fn end(self) -> Done { Ok(()) }
}

impl ser::SerializeTupleVariant for Check {
    type Ok = ();
    type Error = NotJson;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Done { value.serialize(Check) }
    fn end(self) -> Done { Ok(()) }
}

impl ser::SerializeMap for Check {
    type Ok = ();
    type Error = NotJson;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Done { key.serialize(Check) }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Done { value.serialize(Check) }
    fn end(self) -> Done { Ok(()) }
}

impl ser::SerializeStruct for Check {
    type Ok = ();
    type Error = NotJson;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, _: &'static str, value: &T) -> Done { value.serialize(Check) }
    fn end(self) -> Done { Ok(()) }
}

impl ser::SerializeStructVariant for Check {
    type Ok = ();
    type Error = NotJson;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, _: &'static str, value: &T) -> Done { value.serialize(Check) }
    fn end(self) -> Done { Ok(()) }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::check;

    #[test]
    fn only_finite_numbers_are_json() {
        let mut fine = BTreeMap::new();
        fine.insert("ratio", vec![0.5_f64, 1e300]);
        assert!(check(&fine).is_ok());
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let mut nested = BTreeMap::new();
            nested.insert("ratio", vec![Some(1.0), Some(bad)]);
            assert_eq!(check(&nested).unwrap_err().0, "NaN or Infinity");
        }
        assert!(check(&(1_u8, "x", f32::NAN)).is_err());
    }
}
