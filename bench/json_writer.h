// A minimal streaming JSON writer for the benchmark's results file. Written by hand because the
// output is a few flat records and a JSON library would be the benchmark's only other dependency.
#ifndef ANYATTN_BENCH_JSON_WRITER_H_
#define ANYATTN_BENCH_JSON_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

namespace anyattn_bench {

// Builds one JSON document in memory. Calls must nest correctly: inside an object, every value is
// preceded by Key(); inside an array, values follow each other. Commas are inserted automatically.
class JsonWriter {
 public:
  void BeginObject();
  void EndObject();
  void BeginArray();
  void EndArray();
  void Key(const std::string& key);
  void String(const std::string& value);
  // Whole numbers below 1e15 are written exactly, other finite numbers with 6 significant
  // digits; NaN and infinities as null.
  void Number(double value);
  void Integer(int64_t value);
  void Bool(bool value);
  void Null();

  // Key(key) followed by the value.
  void Field(const std::string& key, const std::string& value);
  void Field(const std::string& key, const char* value);
  void Field(const std::string& key, double value);
  void Field(const std::string& key, int64_t value);
  void Field(const std::string& key, int value);
  void Field(const std::string& key, bool value);

  // The document written so far.
  const std::string& text() const { return text_; }

 private:
  // Closes the innermost container with `closer` ('}' or ']').
  void EndContainer(char closer);
  // Writes the comma that separates this value from the previous one in the same container.
  void BeforeValue();

  std::string text_;
  // One entry per open container: true once it holds a value.
  std::vector<bool> has_value_;
  bool after_key_ = false;
};

}  // namespace anyattn_bench

#endif  // ANYATTN_BENCH_JSON_WRITER_H_
