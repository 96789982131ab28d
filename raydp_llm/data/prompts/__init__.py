"""The prompts of learning from rewards (``data.format=prompts``): the ETL's encode stage, the run's
numbered prompt set and its cache entry, the door's look at a file's columns, and a table of prompts
read in parts for batch answers."""
