#include "json_writer.h"

#include <cmath>
#include <cstdio>

namespace anyattn_bench {

void JsonWriter::BeforeValue() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!has_value_.empty()) {
    if (has_value_.back()) text_ += ",";
    has_value_.back() = true;
    text_ += "\n" + std::string(2 * has_value_.size(), ' ');
  }
}

void JsonWriter::BeginObject() {
  BeforeValue();
  text_ += "{";
  has_value_.push_back(false);
}

void JsonWriter::EndContainer(char closer) {
  const bool had_value = has_value_.back();
  has_value_.pop_back();
  if (had_value) text_ += "\n" + std::string(2 * has_value_.size(), ' ');
  text_ += closer;
}

void JsonWriter::EndObject() {
  EndContainer('}');
}

void JsonWriter::BeginArray() {
  BeforeValue();
  text_ += "[";
  has_value_.push_back(false);
}

void JsonWriter::EndArray() {
  EndContainer(']');
}

void JsonWriter::Key(const std::string& key) {
  String(key);
  text_ += ": ";
  after_key_ = true;
}

void JsonWriter::String(const std::string& value) {
  BeforeValue();
  text_ += '"';
  for (const char c : value) {
    switch (c) {
      case '"':
        text_ += "\\\"";
        break;
      case '\\':
        text_ += "\\\\";
        break;
      case '\n':
        text_ += "\\n";
        break;
      case '\t':
        text_ += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
          text_ += escaped;
        } else {
          text_ += c;
        }
    }
  }
  text_ += '"';
}

void JsonWriter::Number(double value) {
  if (!std::isfinite(value)) {
    Null();
    return;
  }
  BeforeValue();
  char buffer[32];
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    std::snprintf(buffer, sizeof(buffer), "%.0f", value);
  } else {
    std::snprintf(buffer, sizeof(buffer), "%.6g", value);
  }
  text_ += buffer;
}

void JsonWriter::Integer(int64_t value) {
  BeforeValue();
  text_ += std::to_string(value);
}

void JsonWriter::Bool(bool value) {
  BeforeValue();
  text_ += value ? "true" : "false";
}

void JsonWriter::Null() {
  BeforeValue();
  text_ += "null";
}

void JsonWriter::Field(const std::string& key, const std::string& value) {
  Key(key);
  String(value);
}

void JsonWriter::Field(const std::string& key, const char* value) {
  Key(key);
  String(value);
}

void JsonWriter::Field(const std::string& key, double value) {
  Key(key);
  Number(value);
}

void JsonWriter::Field(const std::string& key, int64_t value) {
  Key(key);
  Integer(value);
}

void JsonWriter::Field(const std::string& key, int value) {
  Key(key);
  Integer(value);
}

void JsonWriter::Field(const std::string& key, bool value) {
  Key(key);
  Bool(value);
}

}  // namespace anyattn_bench
