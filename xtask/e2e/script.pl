# The perl workload of the end-to-end table: hashes of arrays, sort, join (~0.9 s natively
# here, as the issue's perl run: 1.2 million pushes).
my %h;
for my $i (1 .. 1200000) {
    push @{ $h{ "k" . ($i % 5000) } }, "value-$i-" . ("x" x ($i % 40));
}
my $total = 0;
for my $k (sort keys %h) {
    my $s = join(",", sort @{ $h{$k} });
    $total += length $s;
}
print "$total\n";
