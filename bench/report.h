// The human-readable tables (printed row by row as the run goes) and the JSON results file.
#ifndef ANYATTN_BENCH_REPORT_H_
#define ANYATTN_BENCH_REPORT_H_

#include <string>

#include "results.h"

namespace anyattn_bench {

// Prints the run's header: CPU, ISAs, OpenBLAS core, timing policy.
void PrintRunHeader(const BenchReport& report);

// Prints the measured limits of one thread count.
void PrintLimits(const MachineLimits& limits);

// Prints the forward table's title and column names for `threads` threads.
void PrintFwdTableHeader(int threads);

// Prints one forward row.
void PrintFwdRow(const FwdRow& row);

// Prints the backward table's title and column names for `threads` threads.
void PrintBwdTableHeader(int threads);

// Prints one backward row.
void PrintBwdRow(const BwdRow& row);

// Prints the decode table's title and column names for `threads` threads.
void PrintDecodeTableHeader(int threads, bool kv_huge_pages);

// Prints one decode row.
void PrintDecodeRow(const DecodeRow& row);
// After the decode table: each 8-bit-cache row beside the bf16 row of the same shape (tokens/s =
// B * Sq / median time, and their ratio), when both were run.
void PrintKv8Ratios(const std::vector<DecodeRow>& rows);

// Prints the paired table's title and column names for `threads` threads.
void PrintPairTableHeader(int threads);

// Prints one paired row.
void PrintPairRow(const PairRow& row);

// Prints the --rss-case result.
void PrintRssCase(const RssCaseResult& result);

// Prints the one machine-readable line a parent process parses from an --rss-case child.
void PrintRssCaseMachineLine(const RssCaseResult& result);

// Parses the line printed by PrintRssCaseMachineLine out of a child's output.
RssCaseResult ParseRssCaseOutput(const std::string& output);

// Writes `report` as JSON to `path`, creating missing parent directories. Returns false and sets
// *error on failure.
bool WriteJsonReport(const BenchReport& report, const std::string& path, std::string* error);

}  // namespace anyattn_bench

#endif  // ANYATTN_BENCH_REPORT_H_
